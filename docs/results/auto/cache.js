// Node with a large cache it rarely reads: MIB MiB of 4 KiB Buffers in a
// Map, then REQUESTS lookups of keys in the first tenth, each reading 8
// bytes; prints a digest of what it read.
//
//     node cache.js MIB REQUESTS
const crypto = require('crypto');
const mib = parseInt(process.argv[2]), requests = parseInt(process.argv[3]);
const n = mib * 256;
const cache = new Map();
for (let i = 0; i < n; i++) {
    const b = Buffer.allocUnsafeSlow(4096);
    b.fill(crypto.createHash('sha256').update(String(i)).digest());
    cache.set('k' + i, b);
}
const hot = Math.max(1, Math.floor(n / 10));
let x = 42, digest = 0;
for (let r = 0; r < requests; r++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    const b = cache.get('k' + (x % hot));
    digest = (Math.imul(digest, 31) + b.readUInt32LE((x >>> 8) & 4088)) >>> 0;
}
console.log(cache.size, digest);
