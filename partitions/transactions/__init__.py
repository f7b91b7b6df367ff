"""The transaction coordinator's pure core (Kafka KIP-98): see coordinator.py."""
