// Body of the Logic App's "Execute JavaScript Code" action: builds one approval decision and signs it.
//
// Why JavaScript: the workflow language has no HMAC function, and a Consumption Logic App runs inline
// code on Node.js 8 without require() (so no 'crypto' module): SHA-256 and HMAC are written out here.
// Keep this file to ES2017 syntax (no ?., no ??, no BigInt).
//
// What is signed (docs/deploy.md, schemas/decision.v1.schema.json): the decision without its
// `signature` member, serialized as RFC 8785 canonical JSON (for these fields: keys sorted, no
// whitespace, strings as JSON.stringify writes them, UTF-8), HMAC-SHA256 under the key named by keyId,
// as lowercase hex.
//
// Inputs (outputs of earlier actions): Decision_fields = {decisionId, eventId, target, issuedBy,
// ttlSeconds, reason, keyId}; Signing_key = the shared secret (a secure action: never in run history).
var fields = workflowContext.actions.Decision_fields.outputs;
var key = String(workflowContext.actions.Signing_key.outputs).trim();

function utf8(text) {
  var binary = unescape(encodeURIComponent(text));
  var bytes = new Array(binary.length);
  for (var i = 0; i < binary.length; i++) {
    bytes[i] = binary.charCodeAt(i);
  }
  return bytes;
}

var K = [
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
];

function sha256(bytes) {
  var h = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
  var length = bytes.length;
  var padded = bytes.slice();
  padded.push(0x80);
  while (padded.length % 64 !== 56) {
    padded.push(0);
  }
  var bitsHigh = Math.floor(length / 0x20000000);
  var bitsLow = (length * 8) >>> 0;
  padded.push((bitsHigh >>> 24) & 0xff, (bitsHigh >>> 16) & 0xff, (bitsHigh >>> 8) & 0xff, bitsHigh & 0xff);
  padded.push((bitsLow >>> 24) & 0xff, (bitsLow >>> 16) & 0xff, (bitsLow >>> 8) & 0xff, bitsLow & 0xff);
  var w = new Array(64);
  for (var offset = 0; offset < padded.length; offset += 64) {
    for (var t = 0; t < 16; t++) {
      var j = offset + t * 4;
      w[t] = ((padded[j] << 24) | (padded[j + 1] << 16) | (padded[j + 2] << 8) | padded[j + 3]) >>> 0;
    }
    for (t = 16; t < 64; t++) {
      var x = w[t - 15];
      var y = w[t - 2];
      var s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      var s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[t] = (w[t - 16] + s0 + w[t - 7] + s1) >>> 0;
    }
    var a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (t = 0; t < 64; t++) {
      var S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      var ch = (e & f) ^ (~e & g);
      var temp1 = (k + S1 + ch + K[t] + w[t]) >>> 0;
      var S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      var maj = (a & b) ^ (a & c) ^ (b & c);
      var temp2 = (S0 + maj) >>> 0;
      k = g;
      g = f;
      f = e;
      e = (d + temp1) >>> 0;
      d = c;
      c = b;
      b = a;
      a = (temp1 + temp2) >>> 0;
    }
    h[0] = (h[0] + a) >>> 0;
    h[1] = (h[1] + b) >>> 0;
    h[2] = (h[2] + c) >>> 0;
    h[3] = (h[3] + d) >>> 0;
    h[4] = (h[4] + e) >>> 0;
    h[5] = (h[5] + f) >>> 0;
    h[6] = (h[6] + g) >>> 0;
    h[7] = (h[7] + k) >>> 0;
  }
  var out = [];
  for (var i = 0; i < 8; i++) {
    out.push((h[i] >>> 24) & 0xff, (h[i] >>> 16) & 0xff, (h[i] >>> 8) & 0xff, h[i] & 0xff);
  }
  return out;
}

function hmacSha256Hex(keyBytes, messageBytes) {
  if (keyBytes.length > 64) {
    keyBytes = sha256(keyBytes);
  }
  var inner = [];
  var outer = [];
  for (var i = 0; i < 64; i++) {
    var byte = i < keyBytes.length ? keyBytes[i] : 0;
    inner.push(byte ^ 0x36);
    outer.push(byte ^ 0x5c);
  }
  var digest = sha256(outer.concat(sha256(inner.concat(messageBytes))));
  var hex = '';
  for (i = 0; i < digest.length; i++) {
    hex += (digest[i] < 16 ? '0' : '') + digest[i].toString(16);
  }
  return hex;
}

function canonicalJson(value) {
  if (value === null || typeof value !== 'object') {
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) {
    return '[' + value.map(canonicalJson).join(',') + ']';
  }
  return '{' + Object.keys(value).sort().map(function (name) {
    return JSON.stringify(name) + ':' + canonicalJson(value[name]);
  }).join(',') + '}';
}

var now = Date.now();
var decision = {
  schemaVersion: 1,
  recordType: 'decision',
  decisionId: String(fields.decisionId),
  eventId: String(fields.eventId),
  action: 'approve',
  target: String(fields.target),
  issuedBy: String(fields.issuedBy),
  issuedAt: new Date(now).toISOString(),
  expiresAt: new Date(now + Number(fields.ttlSeconds) * 1000).toISOString()
};
if (fields.reason) {
  decision.reason = String(fields.reason);
}
decision.signature = {
  alg: 'HMAC-SHA256',
  keyId: String(fields.keyId),
  value: hmacSha256Hex(utf8(key), utf8(canonicalJson(decision)))
};
return decision;
