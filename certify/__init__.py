"""Certification of attention models (CROWN-style, with Vertex-Softmax inside)."""
