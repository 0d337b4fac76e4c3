"""The three local services (Kafka, Cassandra, Redis) and the process plumbing they share."""
