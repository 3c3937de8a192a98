"""LayerNorm and BatchNorm1d. (TEMPORARY placeholder, being written now.)"""
from ..module import Module
class LayerNorm(Module):
    pass
class BatchNorm1d(Module):
    pass
