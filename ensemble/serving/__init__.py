"""Online serving of an exported SavedModel with TF Serving's REST API (`ensemble serve`).

Reusable blocks, free of any HTTP framework: `codec` (the REST JSON format, generic over
signatures), `batching` (dynamic batching over replicas), `servables` (model versions: find,
load, swap) and `prometheus` (request metrics in Prometheus text). The Starlette app and the
CLI wiring are in `pipelines.serve`.
"""
