"""The rank agent: the generation loop, heartbeat, abort of a broken generation, fault injection."""
