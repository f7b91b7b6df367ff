"""Security's pure core: the `[security]` settings, principals, Kafka's ACL model and
SCRAM-SHA-256 credentials. Plain Python (no IO): the controller keeps users, tokens and ACLs
in the metadata image; brokers and controllers authenticate and authorize with these types.
"""
