module neuronetes.io/node-agent/nri

go 1.26
