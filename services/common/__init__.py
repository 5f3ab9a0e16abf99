"""Code shared by several Tenure services: contracts, ids, topics and the infrastructure adapters."""
