package stagefs.hdfs;

import java.io.BufferedReader;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileChecksum;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.server.datanode.DataNode;

/**
 * A real HDFS (Hadoop's MiniDFSCluster) for stagefs's tests, driven over
 * stdin and stdout.
 *
 * <p>Arguments: {@code --base-dir DIR} (required; the cluster's storage and
 * the client conf dir live under it), {@code --datanodes N} (default 1),
 * {@code --nn-port P} (default 0: a free port), {@code --block-size B}
 * (default 128 MiB), {@code --replication R} (default min(3, N)),
 * {@code --bytes-per-checksum C} (default 512), {@code --checksum-type T}
 * (CRC32C or CRC32, default CRC32C).
 *
 * <p>When the cluster is up it prints one JSON line on stdout:
 * {@code {"ready":true,"namenode":"hdfs://127.0.0.1:P","nn_port":P,...}};
 * then it reads one command per line on stdin (words separated by single
 * spaces, so paths hold no space) and answers each with one JSON line,
 * {@code {"ok":true,...}} or {@code {"ok":false,"error":"..."}}:
 * <ul>
 *   <li>{@code put LOCAL HDFSPATH [BLOCKSIZE [REPLICATION]]}: copies a local
 *       file in (overwriting), parents created.</li>
 *   <li>{@code get HDFSPATH LOCAL}: copies a file out.</li>
 *   <li>{@code checksum PATH}: {@code getFileChecksum} as the hex of
 *       {@code getBytes()} and its algorithm name.</li>
 *   <li>{@code mkdir PATH}, {@code rm PATH} (recursive), {@code ls PATH}.</li>
 *   <li>{@code stop-datanode I}, {@code restart-datanode I}: I counts the
 *       DataNodes as started (0-based), whichever are stopped.</li>
 *   <li>{@code quit}.</li>
 * </ul>
 * It shuts the cluster down and deletes the base dir on {@code quit} and
 * when stdin closes, so a test that dies never leaves it running.
 * Everything else the JVM prints goes to stderr.
 */
public final class Launcher {
    private final MiniDFSCluster cluster;
    private final FileSystem fs;
    private final File baseDir;
    /** The DataNodes as started: index → transfer address, the name MiniDFSCluster knows them by. */
    private final List<String> dataNodeNames = new ArrayList<>();
    private final Map<Integer, MiniDFSCluster.DataNodeProperties> stopped = new HashMap<>();

    private Launcher(MiniDFSCluster cluster, File baseDir) throws IOException {
        this.cluster = cluster;
        this.fs = cluster.getFileSystem();
        this.baseDir = baseDir;
        for (DataNode dn : cluster.getDataNodes()) {
            dataNodeNames.add(dn.getDatanodeId().getXferAddr());
        }
    }

    public static void main(String[] args) throws Exception {
        // The protocol owns stdout; Hadoop's own printing goes to stderr.
        PrintStream protocol = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);

        Map<String, String> opts = parseArgs(args);
        String base = opts.get("base-dir");
        if (base == null) {
            fail(protocol, "--base-dir DIR is required");
            return;
        }
        int datanodes = Integer.parseInt(opts.getOrDefault("datanodes", "1"));
        int nnPort = Integer.parseInt(opts.getOrDefault("nn-port", "0"));
        long blockSize = Long.parseLong(opts.getOrDefault("block-size", String.valueOf(128L << 20)));
        int replication = Integer.parseInt(opts.getOrDefault("replication", String.valueOf(Math.min(3, datanodes))));
        int bytesPerChecksum = Integer.parseInt(opts.getOrDefault("bytes-per-checksum", "512"));
        String checksumType = opts.getOrDefault("checksum-type", "CRC32C");

        File baseDir = new File(base).getAbsoluteFile();
        File confDir = new File(baseDir, "conf");
        Files.createDirectories(confDir.toPath());

        Configuration conf = new Configuration();
        conf.setLong("dfs.blocksize", blockSize);
        conf.setInt("dfs.replication", replication);
        conf.setInt("dfs.bytes-per-checksum", bytesPerChecksum);
        conf.set("dfs.checksum.type", checksumType);
        // Tests write small files with small blocks to get many blocks.
        conf.setLong("dfs.namenode.fs-limits.min-block-size", 0);
        // A stopped DataNode is noticed in seconds rather than minutes.
        conf.setInt("dfs.heartbeat.interval", 1);
        conf.setInt("dfs.namenode.heartbeat.recheck-interval", 2000);
        conf.setLong("dfs.namenode.stale.datanode.interval", 3000);
        conf.set("hadoop.security.authentication", "simple");
        conf.setBoolean("dfs.permissions.enabled", false);
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        conf.set("dfs.datanode.address", "127.0.0.1:0");
        conf.set("dfs.datanode.http.address", "127.0.0.1:0");
        conf.set("dfs.datanode.ipc.address", "127.0.0.1:0");

        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf, baseDir)
                .numDataNodes(datanodes)
                .nameNodePort(nnPort)
                .nameNodeHttpPort(0)
                .format(true)
                .build();
        cluster.waitActive();
        Launcher launcher = new Launcher(cluster, baseDir);
        try {
            String uri = "hdfs://127.0.0.1:" + cluster.getNameNodePort();
            writeClientConf(confDir, uri, blockSize, replication, bytesPerChecksum, checksumType);

            Json ready = new Json()
                    .put("ready", true)
                    .put("namenode", uri)
                    .put("nn_port", cluster.getNameNodePort())
                    .put("nn_http_port", cluster.getNameNode().getHttpAddress().getPort())
                    .put("conf_dir", confDir.getPath())
                    .put("base_dir", baseDir.getPath())
                    .put("block_size", blockSize)
                    .put("replication", replication)
                    .put("bytes_per_checksum", bytesPerChecksum)
                    .put("checksum_type", checksumType)
                    .put("hadoop_version", org.apache.hadoop.util.VersionInfo.getVersion())
                    .putRaw("datanodes", launcher.dataNodesJson());
            protocol.println(ready);
            launcher.serve(new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)), protocol);
        } finally {
            launcher.shutdown();
        }
    }

    private static void fail(PrintStream protocol, String message) {
        protocol.println(new Json().put("ready", false).put("error", message));
        System.exit(2);
    }

    private static Map<String, String> parseArgs(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value, got " + args[i]);
            }
            opts.put(args[i].substring(2), args[++i]);
        }
        return opts;
    }

    private static void writeClientConf(File confDir, String uri, long blockSize, int replication,
            int bytesPerChecksum, String checksumType) throws IOException {
        Map<String, String> core = new LinkedHashMap<>();
        core.put("fs.defaultFS", uri);
        core.put("hadoop.security.authentication", "simple");
        writeSite(new File(confDir, "core-site.xml"), core);
        Map<String, String> hdfs = new LinkedHashMap<>();
        hdfs.put("dfs.blocksize", String.valueOf(blockSize));
        hdfs.put("dfs.replication", String.valueOf(replication));
        hdfs.put("dfs.bytes-per-checksum", String.valueOf(bytesPerChecksum));
        hdfs.put("dfs.checksum.type", checksumType);
        writeSite(new File(confDir, "hdfs-site.xml"), hdfs);
    }

    private static void writeSite(File file, Map<String, String> props) throws IOException {
        StringBuilder xml = new StringBuilder("<?xml version=\"1.0\"?>\n<configuration>\n");
        for (Map.Entry<String, String> e : props.entrySet()) {
            xml.append("  <property><name>").append(xmlEscape(e.getKey()))
                    .append("</name><value>").append(xmlEscape(e.getValue()))
                    .append("</value></property>\n");
        }
        xml.append("</configuration>\n");
        Files.writeString(file.toPath(), xml.toString(), StandardCharsets.UTF_8);
    }

    private static String xmlEscape(String s) {
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;");
    }

    private String dataNodesJson() {
        StringBuilder out = new StringBuilder("[");
        for (int i = 0; i < dataNodeNames.size(); i++) {
            if (i > 0) {
                out.append(',');
            }
            Json dn = new Json().put("index", i).put("xfer_addr", dataNodeNames.get(i));
            DataNode live = liveDataNode(i);
            dn.put("running", live != null);
            if (live != null) {
                dn.put("xfer_port", live.getXferPort()).put("ipc_port", live.getIpcPort())
                        .put("http_port", live.getInfoPort());
            }
            out.append(dn);
        }
        return out.append(']').toString();
    }

    private DataNode liveDataNode(int index) {
        if (stopped.containsKey(index)) {
            return null;
        }
        String name = dataNodeNames.get(index);
        for (DataNode dn : cluster.getDataNodes()) {
            if (dn.getDatanodeId().getXferAddr().equals(name)) {
                return dn;
            }
        }
        return null;
    }

    private void serve(BufferedReader in, PrintStream out) {
        String line;
        while (true) {
            try {
                line = in.readLine();
            } catch (IOException e) {
                return;
            }
            if (line == null) {
                return;
            }
            line = line.strip();
            if (line.isEmpty()) {
                continue;
            }
            String[] words = line.split(" ");
            if (words[0].equals("quit")) {
                out.println(new Json().put("ok", true));
                return;
            }
            Json reply;
            try {
                reply = run(words).put("ok", true);
            } catch (Exception e) {
                // A RemoteException's message carries the server's stack; its first line says what went wrong.
                String message = String.valueOf(e.getMessage()).lines().findFirst().orElse("");
                reply = new Json().put("ok", false).put("error", e.getClass().getSimpleName() + ": " + message);
            }
            out.println(reply);
        }
    }

    private Json run(String[] w) throws Exception {
        switch (w[0]) {
            case "put": {
                need(w, 3, 5, "put LOCAL HDFSPATH [BLOCKSIZE [REPLICATION]]");
                org.apache.hadoop.fs.Path dst = new org.apache.hadoop.fs.Path(w[2]);
                long blockSize = w.length > 3 ? Long.parseLong(w[3]) : fs.getDefaultBlockSize(dst);
                short replication = w.length > 4 ? Short.parseShort(w[4]) : fs.getDefaultReplication(dst);
                long n = 0;
                try (InputStream src = Files.newInputStream(Path.of(w[1]));
                        FSDataOutputStream os = fs.create(dst, true, 1 << 16, replication, blockSize)) {
                    n = src.transferTo(os);
                }
                return new Json().put("path", w[2]).put("len", n).put("block_size", blockSize)
                        .put("replication", (int) replication);
            }
            case "get": {
                need(w, 3, 3, "get HDFSPATH LOCAL");
                long n;
                try (InputStream src = fs.open(new org.apache.hadoop.fs.Path(w[1]));
                        OutputStream dst = new FileOutputStream(w[2])) {
                    n = src.transferTo(dst);
                }
                return new Json().put("path", w[1]).put("len", n);
            }
            case "checksum": {
                need(w, 2, 2, "checksum PATH");
                FileChecksum sum = fs.getFileChecksum(new org.apache.hadoop.fs.Path(w[1]));
                if (sum == null) {
                    throw new IOException("no checksum for " + w[1]);
                }
                // getBytes() may return a longer backing array; Hive and
                // `hdfs dfs -checksum` print its first getLength() bytes.
                byte[] bytes = Arrays.copyOf(sum.getBytes(), sum.getLength());
                return new Json().put("path", w[1]).put("algorithm", sum.getAlgorithmName())
                        .put("hex", hex(bytes)).put("length", sum.getLength());
            }
            case "mkdir": {
                need(w, 2, 2, "mkdir PATH");
                return new Json().put("created", fs.mkdirs(new org.apache.hadoop.fs.Path(w[1])));
            }
            case "rm": {
                need(w, 2, 2, "rm PATH");
                return new Json().put("deleted", fs.delete(new org.apache.hadoop.fs.Path(w[1]), true));
            }
            case "ls": {
                need(w, 2, 2, "ls PATH");
                StringBuilder entries = new StringBuilder("[");
                boolean first = true;
                for (FileStatus st : fs.listStatus(new org.apache.hadoop.fs.Path(w[1]))) {
                    if (!first) {
                        entries.append(',');
                    }
                    first = false;
                    entries.append(new Json()
                            .put("path", st.getPath().toUri().getPath())
                            .put("len", st.getLen())
                            .put("is_dir", st.isDirectory())
                            .put("block_size", st.getBlockSize())
                            .put("replication", (int) st.getReplication())
                            .put("mtime_ms", st.getModificationTime()));
                }
                return new Json().putRaw("entries", entries.append(']').toString());
            }
            case "stop-datanode": {
                need(w, 2, 2, "stop-datanode I");
                int i = dataNodeIndex(w[1]);
                if (stopped.containsKey(i)) {
                    throw new IllegalStateException("DataNode " + i + " is already stopped");
                }
                MiniDFSCluster.DataNodeProperties props = cluster.stopDataNode(dataNodeNames.get(i));
                if (props == null) {
                    throw new IllegalStateException("DataNode " + i + " is not running");
                }
                stopped.put(i, props);
                return new Json().putRaw("datanodes", dataNodesJson());
            }
            case "restart-datanode": {
                need(w, 2, 2, "restart-datanode I");
                int i = dataNodeIndex(w[1]);
                MiniDFSCluster.DataNodeProperties props = stopped.get(i);
                if (props == null) {
                    throw new IllegalStateException("DataNode " + i + " is not stopped");
                }
                if (!cluster.restartDataNode(props, true)) {
                    throw new IOException("DataNode " + i + " did not restart");
                }
                stopped.remove(i);
                cluster.waitActive();
                return new Json().putRaw("datanodes", dataNodesJson());
            }
            case "datanodes": {
                need(w, 1, 1, "datanodes");
                return new Json().putRaw("datanodes", dataNodesJson());
            }
            default:
                throw new IllegalArgumentException("unknown command " + w[0]
                        + " (put, get, checksum, mkdir, rm, ls, stop-datanode, restart-datanode, datanodes, quit)");
        }
    }

    private int dataNodeIndex(String word) {
        int i = Integer.parseInt(word);
        if (i < 0 || i >= dataNodeNames.size()) {
            throw new IllegalArgumentException("no DataNode " + i + " (there are " + dataNodeNames.size() + ")");
        }
        return i;
    }

    private static void need(String[] w, int min, int max, String usage) {
        if (w.length < min || w.length > max) {
            throw new IllegalArgumentException("usage: " + usage);
        }
    }

    private static String hex(byte[] bytes) {
        StringBuilder s = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            s.append(String.format("%02x", b & 0xff));
        }
        return s.toString();
    }

    private void shutdown() {
        try {
            fs.close();
        } catch (IOException e) {
            System.err.println("closing the client: " + e);
        }
        cluster.shutdown(true);
        deleteTree(baseDir.toPath());
    }

    private static void deleteTree(Path root) {
        if (!Files.exists(root)) {
            return;
        }
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            System.err.println("deleting " + root + ": " + e);
        }
    }

    /** One JSON object, written by hand: the launcher has no JSON library. */
    static final class Json {
        private final StringBuilder body = new StringBuilder();

        private Json key(String k) {
            if (body.length() > 0) {
                body.append(',');
            }
            body.append(quote(k)).append(':');
            return this;
        }

        Json put(String k, String v) {
            key(k).body.append(quote(v));
            return this;
        }

        Json put(String k, long v) {
            key(k).body.append(v);
            return this;
        }

        Json put(String k, boolean v) {
            key(k).body.append(v);
            return this;
        }

        Json putRaw(String k, String json) {
            key(k).body.append(json);
            return this;
        }

        @Override
        public String toString() {
            return "{" + body + "}";
        }

        static String quote(String s) {
            StringBuilder q = new StringBuilder("\"");
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"': q.append("\\\""); break;
                    case '\\': q.append("\\\\"); break;
                    case '\n': q.append("\\n"); break;
                    case '\r': q.append("\\r"); break;
                    case '\t': q.append("\\t"); break;
                    default:
                        if (c < 0x20) {
                            q.append(String.format("\\u%04x", (int) c));
                        } else {
                            q.append(c);
                        }
                }
            }
            return q.append('"').toString();
        }
    }
}
