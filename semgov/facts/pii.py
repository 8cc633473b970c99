"""PII findings in donor text with Presidio, offline, cached per donor.

Presidio's default engine downloads a spaCy model; here it runs on a blank
English spaCy pipeline, which keeps every pattern and checksum recognizer
(email, phone, credit card with Luhn, IBAN, US SSN, IP, ...). Names and
locations need an NER model and are out of scope.

A scan costs ~0.2 s per 4k tokens, so results are cached by the donor's token
hash and text hash: one scan per donor, never one per candidate.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

DEFAULT_PHONE_REGIONS: tuple[str, ...] = ("US", "GB", "FR", "IL", "IN", "CA", "BR")


class PiiScanner:
    """Scan text for PII entity types; thread-safe, lazily initialised, LRU-cached.

    ``phone_regions`` are the regions whose national number formats Presidio's
    phone recognizer looks for (international ``+CC`` numbers are found whatever
    the regions). Presidio's default list includes ``DE``, whose short formats
    match ordinary decimals such as "164.2 million"; semgov leaves DE out by default.
    """

    def __init__(self, *, cache_size: int = 4096) -> None:
        self._analyzers: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[object, ...], frozenset[str]] = OrderedDict()
        self._cache_size = cache_size
        self.scans = 0  # number of real Presidio scans run (cache misses)

    def _engine(self, phone_regions: tuple[str, ...]) -> Any:
        analyzer = self._analyzers.get(phone_regions)
        if analyzer is None:
            import spacy
            import tldextract
            from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
            from presidio_analyzer.nlp_engine import SpacyNlpEngine
            from presidio_analyzer.predefined_recognizers import EmailRecognizer, PhoneRecognizer

            # NOTE: Presidio's email recognizer validates domains with tldextract's
            # module-level extractor, which fetches the public suffix list over the
            # network unless configured before import. Ours never fetches: it uses
            # the suffix list bundled with tldextract, whatever the host did first.
            offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

            class _OfflineEmailRecognizer(EmailRecognizer):
                def validate_result(self, pattern_text: str) -> bool:
                    return offline(pattern_text).fqdn != ""

            class _BlankSpacyEngine(SpacyNlpEngine):
                """Presidio spaCy engine over ``spacy.blank('en')``: no model download."""

                def __init__(self) -> None:
                    super().__init__(models=[{"lang_code": "en", "model_name": "blank:en"}])

                def load(self) -> None:
                    self.nlp = {"en": spacy.blank("en")}  # type: ignore[assignment]

            nlp = _BlankSpacyEngine()
            nlp.load()
            registry = RecognizerRegistry(supported_languages=["en"])
            registry.load_predefined_recognizers(nlp_engine=nlp, languages=["en"])
            registry.remove_recognizer("PhoneRecognizer")
            registry.add_recognizer(PhoneRecognizer(supported_regions=phone_regions))
            registry.remove_recognizer("EmailRecognizer")
            registry.add_recognizer(_OfflineEmailRecognizer())
            analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp, supported_languages=["en"])
            self._analyzers[phone_regions] = analyzer
        return analyzer

    def scan(
        self,
        text: str,
        *,
        donor_token_hash: str,
        min_score: float,
        phone_regions: tuple[str, ...] = DEFAULT_PHONE_REGIONS,
        entities: tuple[str, ...] | None = None,
    ) -> frozenset[str]:
        """Entity types found in ``text`` with score >= ``min_score``.

        ``entities`` limits the scan to those types (the ones a policy forbids):
        recognizers for other types do not run, which saves about a third.
        """
        if entities is not None and not entities:
            return frozenset()
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        key = (donor_token_hash, digest, min_score, phone_regions, entities)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            engine = self._engine(phone_regions)
            results = engine.analyze(
                text=text,
                language="en",
                score_threshold=min_score,
                entities=list(entities) if entities is not None else None,
            )
            self.scans += 1
            found = frozenset(r.entity_type for r in results)
            self._cache[key] = found
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return found
