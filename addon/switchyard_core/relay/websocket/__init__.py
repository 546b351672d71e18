"""Responses over WebSocket, terminated in the relay: the session, its turns, the upstream socket."""
