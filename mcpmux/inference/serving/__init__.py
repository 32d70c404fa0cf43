"""What serves requests: the service over local engines or a remote server, embeddings, sampling."""
