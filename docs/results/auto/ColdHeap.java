// An OpenJDK program with a large heap it mostly leaves alone: MIB MiB of
// 64 KiB arrays, then REQUESTS requests, each reading 64 bytes of one of
// the first tenth of them and making a little garbage (young collections
// run, as in a service), then a digest of what it read.
//
//     java -cp . ColdHeap MIB REQUESTS
public class ColdHeap {
    public static void main(String[] a) {
        int mib = Integer.parseInt(a[0]);
        long requests = Long.parseLong(a[1]);
        int n = mib * 16;
        byte[][] heap = new byte[n][];
        for (int i = 0; i < n; i++) {
            byte[] b = new byte[64 << 10];
            long x = i * 0x9E3779B97F4A7C15L + 1;
            for (int j = 0; j < b.length; j += 8) {
                x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
                for (int k = 0; k < 8; k++) b[j + k] = (byte) (x >>> (8 * k));
            }
            heap[i] = b;
        }
        int hot = Math.max(1, n / 10);
        long x = 42, digest = 0;
        Object[] garbage = new Object[64];
        for (long r = 0; r < requests; r++) {
            x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            byte[] b = heap[(int) Long.remainderUnsigned(x, hot)];
            int off = (int) ((x >>> 32) & ((64 << 10) - 64));
            for (int k = 0; k < 64; k += 8) digest = digest * 31 + b[off + k];
            if ((r & 63) == 0) garbage[(int) (r >>> 6) & 63] = new byte[4096];
        }
        System.out.println(mib + " " + digest);
    }
}
