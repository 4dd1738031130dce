"""`graphpool bench serve`: a live server per graph configuration, driven by a streaming openai client."""
