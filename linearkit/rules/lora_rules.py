"""The rules of linearkit's lora layers: filled in by the surgery work."""

RULES: list = []
