"""Certification of attention models (CROWN-style, with Vertex-Softmax inside).

Any torch module built from supported operators (``supported_operators``) is traced by
``certify.trace`` and bounded on the verifier's own graph (``certify.graph``).
"""
from softcert.certify.api import (
    AttentionBox,
    AttentionScores,
    attention_boxes,
    attention_scores,
    embed,
    forward,
    linear_bounds,
    verify,
    verify_box,
    verify_text,
)
from softcert.certify.attack import AttackResult, attack
from softcert.certify.evaluation import (
    SKIP_BROKEN,
    Cascade,
    Evaluation,
    Record,
    SoundnessError,
    certified_accuracy,
    evaluate,
    robust_accuracy,
)
from softcert.certify.graph import AttentionSite, Graph, GraphModule
from softcert.certify.graph_cache import check_supported, graph_of
from softcert.certify.lowering import SOFTMAX_FORMS, softmax_form
from softcert.certify.methods import METHODS, Method
from softcert.certify.models import ViT
from softcert.certify.ops import OPERATORS, Operator
from softcert.certify.options import AttackOptions, BabOptions, BoundOptions, PropagationOptions
from softcert.certify.result import CertResult, Problem, SampleVerdict
from softcert.certify.trace import logits_of, supported_operators, trace
from softcert.certify.training import (
    CertifiedTraining,
    EpochRecord,
    IntervalWidths,
    NodeWidth,
    interval_widths,
    margin_bounds,
    robust_loss,
    train_certified,
)
from softcert.certify.vnnlib import Property, Region, read_vnnlib

# the ONNX front end and the VNN-COMP solver import onnx (the "data" extra): loaded on first use
_LAZY = {"ONNX_OPERATORS": "softcert.certify.onnx_graph", "OnnxNetwork": "softcert.certify.onnx_graph",
         "read_onnx": "softcert.certify.onnx_graph", "Verdict": "softcert.certify.vnncomp"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'softcert.certify' has no attribute {name!r}")

__all__ = ["METHODS", "OPERATORS", "SOFTMAX_FORMS", "AttackResult", "AttackOptions", "AttentionBox", "AttentionScores", "AttentionSite", "BabOptions", "BoundOptions",
           "CertResult", "Problem", "PropagationOptions", "SampleVerdict", "Evaluation", "Graph", "GraphModule",
           "Method", "Operator", "Record", "SKIP_BROKEN", "Cascade", "SoundnessError", "ViT", "attack", "attention_boxes", "attention_scores",
           "certified_accuracy", "check_supported", "embed", "evaluate", "forward", "graph_of", "linear_bounds",
           "logits_of", "robust_accuracy", "softmax_form", "supported_operators", "trace", "verify", "verify_box", "verify_text"]
__all__ += ["CertifiedTraining", "EpochRecord", "IntervalWidths", "NodeWidth", "interval_widths", "margin_bounds",
            "robust_loss", "train_certified"]
__all__ += ["ONNX_OPERATORS", "OnnxNetwork", "Property", "Region", "Verdict", "read_onnx", "read_vnnlib"]
