"""Translation between the four APIs, for an upstream that speaks another API than its route."""
