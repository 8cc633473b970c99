"""The native YAML policy: its model and loader (``model``) and its engine (``engine``)."""
