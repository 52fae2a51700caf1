"""Client protocols over the runner: the AI SDK's UI message stream and AG-UI, from one translation of events.

`steps` turns a turn's events into protocol-neutral steps, `chat` starts, answers, stops and
streams turns of a conversation; each protocol module parses its client's requests and
writes the steps in its own format.
"""
