"""The topic catalogue. Stage code gets topic names from ``Topics``."""
from topics.catalogue import BY_NAME, CATALOGUE, Topic, Topics, generate_topic_name

__all__ = ["BY_NAME", "CATALOGUE", "Topic", "Topics", "generate_topic_name"]
