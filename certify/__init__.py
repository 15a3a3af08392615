"""Certification of attention models (CROWN-style, with Vertex-Softmax inside)."""
from certify.api import METHODS, CertResult, verify
from certify.attack import AttackResult, attack
from certify.models import ViT, check_supported

__all__ = ["METHODS", "AttackResult", "CertResult", "ViT", "attack", "check_supported", "verify"]
