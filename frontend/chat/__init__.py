"""The chat layer every generating API builds on: the chat request (`protocol.py`, OpenAI's shape, which the
other APIs translate into), the chat template (`template.py`), tools (`tool_choice.py` plans them,
`tool_parsers/` read calls), reasoning (`reasoning/`), structured outputs (`structured_outputs.py`), the
one chat preparation (`preparation.py`: a chat request into its engine request) and the output parser
(`output.py`: a choice's text into content, reasoning and tool-call parts)."""
