"""The broker process and its HTTP API (see http_api/README.md for the module table)."""
