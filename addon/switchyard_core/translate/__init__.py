"""Translation between the four APIs, for an upstream that speaks another API than
the client (docs/translation.md): the request half (`request.py`, `requests/`) and
the answer-stream half beside it.  Pure: values in, values out."""
