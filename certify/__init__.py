"""Certification of attention models (CROWN-style, with Vertex-Softmax inside)."""
from certify.api import AttentionScores, CertResult, attention_scores, verify
from certify.attack import AttackResult, attack
from certify.evaluation import Evaluation, Record, SoundnessError, certified_accuracy, evaluate, robust_accuracy
from certify.methods import METHODS, Method
from certify.models import ViT, check_supported
from certify.ops import OPERATORS, Operator

__all__ = ["METHODS", "OPERATORS", "AttackResult", "AttentionScores", "CertResult", "Evaluation", "Method",
           "Operator", "Record", "SoundnessError", "ViT", "attack", "attention_scores", "certified_accuracy",
           "check_supported", "evaluate", "robust_accuracy", "verify"]
