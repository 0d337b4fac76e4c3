"""The topic catalogue and the Kafka transport. Stage code gets topic and group names from ``Topics``."""
from topics.catalogue import ALL, FIXED, GENERATE, Role, Topic, Topics, catalogue, generate_topic_name

__all__ = ["ALL", "FIXED", "GENERATE", "Role", "Topic", "Topics", "catalogue", "generate_topic_name"]
