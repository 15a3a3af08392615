"""Sound enclosures of softmax over score boxes: the primitives of softcert."""
from bounds.vertex import VertexBounds, vertex_softmax

__all__ = ["VertexBounds", "vertex_softmax"]
