"""Several models in one server: which models there are and their settings (catalog.py), how a route finds
the model a request names (registry.py: the one accessor), and the routes of their lifecycle (routes.py).
The engines themselves are the client side's ModelPool (engine/client/model_pool.py)."""
