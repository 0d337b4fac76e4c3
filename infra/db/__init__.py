"""Cassandra access: a session with an asyncio bridge, and one repository per table family."""
