"""What the exporter and the service must agree on, and nothing else.

`manifest` (the version folder's schema and its integrity checks), `graphs` (graph input/output
names, special token ids, the batch layout, the IO contract version) and `spans` (protected spans
and their placeholders, shared by training data and serving). `export/` imports only this package
from `service/`; the service image carries no training code.
"""
