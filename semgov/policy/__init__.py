"""The policy layer: the policy-engine interface, one loader and engine registry for every policy
language (``source``), the YAML policy (``yaml/``), Rego policies and their engines (``rego/``),
the policy case-file runner (``testing``) and calibration overlays."""
