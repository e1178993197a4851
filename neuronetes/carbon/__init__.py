"""Carbon-aware time shifting: grid carbon-intensity sources and the gate-release decision. Pure core.

`intensity` reads a grid's carbon intensity (gCO2eq/kWh, location-based) and its forecast from one
of four sources behind one interface (`IntensitySource`); `release` decides when a pod held by the
``neuronetes.io/carbon`` scheduling gate may start, and estimates the gCO2 its delay avoided.
The operator's gate-release controller (``neuronetes_operator.carbon_gate``) does the API calls
around them; docs/carbon.md describes both.
"""
