"""The rules of linearkit's sparse layers: filled in by the surgery work."""

RULES: list = []
