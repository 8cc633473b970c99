"""Load a policy directory in whatever language it is written, and pick its engine."""

from __future__ import annotations

from pathlib import Path

from semgov.engine import PolicyEngine, PolicySource
from semgov.errors import PolicyError
from semgov.limits import Limits, resolve
from semgov.policy import POLICY_FILE, Policy, load_policy
from semgov.rego_policy import RegoPolicy, load_rego_policy, rego_files

ENGINES = ("auto", "yaml", "regorus", "opa-inprocess")


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


def make_engine(policy: PolicySource, engine: str = "auto") -> PolicyEngine:
    """The engine for ``policy``: its default for ``auto``, or the one named."""
    if engine == "auto":
        return policy.make_engine()
    if engine == "yaml":
        if not isinstance(policy, Policy):
            raise PolicyError("--engine yaml needs a YAML policy (policy.yaml)")
        return policy.make_engine()
    if not isinstance(policy, RegoPolicy):
        raise PolicyError(f"--engine {engine} needs a Rego policy directory (*.rego)")
    from semgov.rego_engines import OpaInProcessEngine, RegorusEngine

    if engine == "regorus":
        return RegorusEngine(policy)
    if engine == "opa-inprocess":
        try:
            return OpaInProcessEngine(policy)
        except ImportError as e:
            raise PolicyError(
                "--engine opa-inprocess needs opa-golib-python-bindings "
                "(pip install --no-deps --ignore-requires-python opa-golib-python-bindings==0.4.4)"
            ) from e
    raise PolicyError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
