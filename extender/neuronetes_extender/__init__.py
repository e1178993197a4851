"""NeuroNetes scheduler extender (FastAPI): filter, prioritize, bind and preempt verbs over the GPU cache."""
