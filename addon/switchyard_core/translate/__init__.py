"""Translation between the four APIs, for an upstream that speaks another API than
its route (docs/translation.md): the request half (`request.py`, `requests/`) and
the answer half (`streams/`).  Pure: values in, values out."""
