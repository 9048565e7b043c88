// A Node.js client of throttlekit-rls for TestNodeClientMatchesGo.
//
//	node client.js HOST:PORT
//
// Reads one request per line on stdin, as JSON:
//
//	{"domain": "d", "hitsAddend": 0,
//	 "descriptors": [{"entries": [{"key": "k", "value": "v"}],
//	                  "hitsAddend": 2,                                   (optional: google.protobuf.UInt64Value)
//	                  "limit": {"requestsPerUnit": 1, "unit": "MINUTE"}}]} (optional)
//
// sends it to envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// and writes the answer on stdout as one JSON line, in the shape the Go test
// builds from its own client's answer:
//
//	{"grpcCode": 0, "overallCode": "OK",
//	 "statuses": [{"code": "OK", "limit": {"name": "", "requestsPerUnit": 3, "unit": "MINUTE"},
//	               "remaining": 2, "resetMs": 40000}],
//	 "headers": [{"key": "RateLimit-Limit", "value": "3"}]}
//
// or, when the call fails, {"grpcCode": N, "message": "..."}. Requests are
// sent one at a time, in order; the process ends when stdin closes.
'use strict';

const path = require('node:path');
const readline = require('node:readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const definition = protoLoader.loadSync('envoy/service/ratelimit/v3/rls.proto', {
  // google/protobuf/*.proto come bundled with protobufjs.
  includeDirs: [path.join(__dirname, 'proto')],
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const RateLimitService = grpc.loadPackageDefinition(definition).envoy.service.ratelimit.v3.RateLimitService;

const callTimeoutMs = 10000;

// toRequest turns a request line into the message grpc-js serializes.
function toRequest(req) {
  return {
    domain: req.domain || '',
    hitsAddend: req.hitsAddend || 0,
    descriptors: (req.descriptors || []).map((d) => {
      const out = { entries: (d.entries || []).map((e) => ({ key: e.key, value: e.value })) };
      if (d.hitsAddend !== undefined && d.hitsAddend !== null) {
        // A wrapper: {value: 0} is present (check without counting), unlike
        // an absent hits_addend.
        out.hitsAddend = { value: d.hitsAddend };
      }
      if (d.limit) {
        out.limit = { requestsPerUnit: d.limit.requestsPerUnit, unit: d.limit.unit };
      }
      return out;
    }),
  };
}

// durationMs is a google.protobuf.Duration in milliseconds, or null.
function durationMs(d) {
  if (!d) return null;
  return Number(d.seconds || 0) * 1000 + Math.round((d.nanos || 0) / 1e6);
}

// toAnswer turns a RateLimitResponse into the answer line.
function toAnswer(resp) {
  return {
    grpcCode: 0,
    overallCode: resp.overallCode,
    statuses: (resp.statuses || []).map((s) => ({
      code: s.code,
      limit: s.currentLimit
        ? { name: s.currentLimit.name, requestsPerUnit: s.currentLimit.requestsPerUnit, unit: s.currentLimit.unit }
        : null,
      remaining: s.limitRemaining,
      resetMs: durationMs(s.durationUntilReset),
    })),
    headers: (resp.responseHeadersToAdd || []).map((h) => ({ key: h.key, value: h.value })),
  };
}

function ask(client, req) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + callTimeoutMs);
    client.shouldRateLimit(toRequest(req), { deadline }, (err, resp) => {
      if (err) {
        resolve({ grpcCode: err.code, message: err.details });
        return;
      }
      resolve(toAnswer(resp));
    });
  });
}

async function main() {
  const addr = process.argv[2];
  if (!addr) {
    process.stderr.write('usage: node client.js HOST:PORT\n');
    process.exit(2);
  }
  const client = new RateLimitService(addr, grpc.credentials.createInsecure());
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity, terminal: false });
  for await (const line of lines) {
    if (line.trim() === '') continue;
    const answer = await ask(client, JSON.parse(line));
    process.stdout.write(JSON.stringify(answer) + '\n');
  }
  client.close();
}

main().catch((err) => {
  process.stderr.write(String((err && err.stack) || err) + '\n');
  process.exit(1);
});
