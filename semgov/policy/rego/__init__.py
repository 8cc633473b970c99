"""Rego policies: the loader and its conventions (``loader``), the embedded engines (regorus,
OPA in-process: ``engines``) and an OPA server (``opa_server``)."""
