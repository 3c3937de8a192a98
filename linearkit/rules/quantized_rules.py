"""The rules of linearkit's quantized layers: filled in by the surgery work."""

RULES: list = []
