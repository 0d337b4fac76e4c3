"""The CQL schema as versioned migrations (``NNN_name.cql``) and the code that applies them."""
