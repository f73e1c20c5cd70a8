"""agent_flow: stateful, tool-using LLM agents whose every prompt fits a hard token budget."""
