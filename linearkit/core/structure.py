"""One token for the structure of every module: replaced whenever any module gains, loses or
swaps a child or a Parameter, gets or drops a hook, or has any attribute assigned (its class
included). A plan derived from a model's structure (runtime/compiled_chain.py) stays valid while the
token it was made under is still ``token``; what can change without a module knowing (a
Parameter's ``data``, ``requires_grad``, an array's flags) the plan checks itself.

The token is a fresh ``object()``, not a counter: a copied or unpickled plan carries a copy of
it, never the token itself, so a model's copy always plans anew.
"""

token = object()


def changed() -> None:
    """Invalidate every plan made under the current token."""
    global token
    token = object()
