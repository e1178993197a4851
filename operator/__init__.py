"""NeuroNetes operator (kopf): reconciles AgentPool, GPUSlice and ToolBinding; admission webhook."""
