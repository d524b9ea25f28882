# Azurite (Azure Blob emulator) for the local stack, the version the test suite pins
# (tests/node/package.json): 3.35.x runs on Node 20.
FROM node:20-alpine
RUN npm install --global --no-audit --no-fund azurite@3.35.0
EXPOSE 10000
ENTRYPOINT ["azurite-blob"]
CMD ["--blobHost", "0.0.0.0", "--blobPort", "10000", "--location", "/data", "--skipApiVersionCheck", \
     "--loose", "--disableProductStyleUrl", "--disableTelemetry"]
