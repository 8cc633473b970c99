"""Load a policy directory in whatever language it is written, and pick its engine: the one
place where a policy language and an engine are chosen (the CLI, the evaluator and the SGLang
hook all come here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from semgov.errors import PolicyError
from semgov.intake.limits import Limits, resolve
from semgov.policy.choices import ENGINES
from semgov.policy.engine import PolicyEngine, PolicySource
from semgov.policy.rego.engines import OpaInProcessEngine, RegorusEngine
from semgov.policy.rego.loader import RegoPolicy, load_rego_policy, rego_files
from semgov.policy.yaml.engine import YamlEngine
from semgov.policy.yaml.model import POLICY_FILE, Policy, load_policy


def load_policy_source(path: Path, *, limits: Limits | None = None) -> PolicySource:
    """A YAML policy (``policy.yaml`` or a ``.yaml`` file) or a Rego policy directory (``*.rego``).

    ``limits`` (default: :meth:`Limits.from_env`) bounds policy size, YAML nesting and aliases,
    and Rego nesting.
    """
    lim = resolve(limits)
    if path.is_file():
        if path.suffix in (".yaml", ".yml"):
            return load_policy(path, limits=lim)
        raise PolicyError(
            "a policy is a directory (policy.yaml or *.rego files) or a .yaml file", source=str(path)
        )
    if not path.is_dir():
        raise PolicyError("policy directory not found", source=str(path))
    has_yaml = (path / POLICY_FILE).exists()
    modules, _ = rego_files(path, limits=lim)
    if has_yaml and modules:
        raise PolicyError(
            f"holds both {POLICY_FILE} and .rego modules; keep one policy per directory", source=str(path)
        )
    if modules:
        return load_rego_policy(path, limits=lim)
    return load_policy(path, limits=lim)  # reports the missing policy.yaml


@dataclass(frozen=True)
class OpaServer:
    """Where an OPA server is, for ``--opa-url`` (the ``opa-server`` engine)."""

    url: str
    timeout: float = 2.0
    upload: bool = True


def make_engine(policy: PolicySource, engine: str = "auto", *, opa: OpaServer | None = None) -> PolicyEngine:
    """The one place a policy engine is chosen: the policy's own default for ``auto``
    (``policy.engine_name``), or the one named; with ``opa``, an OPA server (Rego only)."""
    if opa is not None:
        if not isinstance(policy, RegoPolicy) or engine not in ("auto", "regorus"):
            raise PolicyError("--opa-url needs a Rego policy directory and no other --engine")
        from semgov.policy.rego.opa_server import OpaServerEngine  # NOTE: imports an HTTP client

        return OpaServerEngine(policy, opa.url, timeout=opa.timeout, upload=opa.upload)
    name = policy.engine_name if engine == "auto" else engine
    if name == "yaml":
        if not isinstance(policy, Policy):
            raise PolicyError("--engine yaml needs a YAML policy (policy.yaml)")
        return YamlEngine(policy)
    if name not in ENGINES:
        raise PolicyError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if not isinstance(policy, RegoPolicy):
        raise PolicyError(f"--engine {engine} needs a Rego policy directory (*.rego)")
    if name == "regorus":
        return RegorusEngine(policy)
    try:
        return OpaInProcessEngine(policy)
    except ImportError as e:
        from semgov.policy.testing import OPA_INPROCESS_HINT

        raise PolicyError(OPA_INPROCESS_HINT) from e
