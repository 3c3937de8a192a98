"""placeholder being written"""
from .module import Module
class MSELoss(Module): pass
class L1Loss(Module): pass
class CrossEntropyLoss(Module): pass
class BCEWithLogitsLoss(Module): pass
