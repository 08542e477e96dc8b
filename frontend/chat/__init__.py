"""The chat layer every generating API builds on: request types, the chat template, tool calls, reasoning,
structured outputs, and the one chat preparation."""
