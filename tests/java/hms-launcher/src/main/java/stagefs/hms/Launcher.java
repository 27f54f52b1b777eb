package stagefs.hms;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocatedFileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RemoteIterator;
import org.apache.hadoop.hive.metastore.HiveMetaStore;
import org.apache.hadoop.hive.metastore.HiveMetaStoreClient;
import org.apache.hadoop.hive.metastore.ReplChangeManager;
import org.apache.hadoop.hive.metastore.api.Catalog;
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.metastore.api.FieldSchema;
import org.apache.hadoop.hive.metastore.api.FireEventRequest;
import org.apache.hadoop.hive.metastore.api.FireEventRequestData;
import org.apache.hadoop.hive.metastore.api.InsertEventRequestData;
import org.apache.hadoop.hive.metastore.api.Partition;
import org.apache.hadoop.hive.metastore.api.SerDeInfo;
import org.apache.hadoop.hive.metastore.api.StorageDescriptor;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.api.TableValidWriteIds;
import org.apache.hadoop.hive.metastore.conf.MetastoreConf;
import org.apache.hadoop.hive.metastore.security.HadoopThriftAuthBridge;
import org.apache.hadoop.hive.metastore.utils.MetaStoreUtils;

/**
 * A real Hive metastore for stagefs's tests, driven over stdin/stdout.
 *
 * <p>Start: {@code Launcher --base-dir DIR --hdfs hdfs://HOST:PORT --db-type postgres|mysql
 * --jdbc-url URL --db-user U --db-password P --scripts DIR [--encoder json|gzip]
 * [--translate-managed true|false]}. It runs Hive's
 * own schematool ({@link MetastoreSchemaTool} -initSchema) against the database, starts the
 * metastore's Thrift server on a free port with NotificationLogListener (ours; see that class) as transactional listener,
 * DML events on and change management (cmroot) on HDFS, and prints one JSON ready line
 * ({@code thrift_uri}, {@code hdfs}, {@code warehouse}, {@code cmroot}, {@code conf_dir},
 * {@code hive_version}, {@code encoder}).
 *
 * <p>Then one JSON line per command on stdin (words separated by single spaces), each answer
 * {@code "ok":true|false}; a successful answer carries {@code event_id} (the metastore's current
 * notification id) and {@code source}: every table of every database as the metastore API and an
 * HDFS listing show it, each file with its length, HDFS checksum and sha256 (the oracle,
 * independent of the notification log). Commands call
 * HiveMetaStoreClient the way HiveServer2 does:
 *
 * <ul>
 *   <li>{@code create-db DB [repl-source]} (repl-source: {@code repl.source.for} set, so the
 *       metastore recycles the files it drops into cmroot), {@code alter-db-not-repl-source DB}
 *       (removes it: Hive drops no database that is a replication source)
 *   <li>{@code create-table DB TBL parquet|text [PARTKEY...]} (columns id int, v string)
 *   <li>{@code add-partition DB TBL VAL...}
 *   <li>{@code insert DB TBL into|overwrite LOCALFILE [VAL...]}: writes the file into the table or
 *       partition directory on HDFS (overwrite first recycles the old files through
 *       ReplChangeManager and deletes them), then fires the INSERT event with the new file and its
 *       HDFS checksum.
 *   <li>{@code drop-partition DB TBL VAL...}, {@code rename DB TBL NEWTBL}, {@code truncate DB
 *       TBL [VAL...]}, {@code drop-table DB TBL}, {@code drop-db DB [cascade]}
 *   <li>{@code exchange SRCDB SRCTBL DESTDB DESTTBL VAL...}: ALTER TABLE DESTTBL EXCHANGE
 *       PARTITION (spec) WITH TABLE SRCTBL (the values name the leading partition keys): the
 *       metastore moves the partition directory from the source table to the destination on HDFS
 *       and fires ADD_PARTITION on the destination, DROP_PARTITION on the source.
 *   <li>{@code state} (just the oracle), {@code quit}
 *   <li>{@code create-catalog CAT}: a catalog located at {@code /catalogs/CAT} on the HDFS. A
 *       {@code DB} argument of create-db, create-table, create-acid-table, add-partition, insert,
 *       acid-insert, drop-partition and drop-table may be {@code DB@CAT}: that database of catalog
 *       CAT (else of the default catalog, {@code hive}).
 *   <li>{@code create-acid-table DB TBL text [PARTKEY...]}: an insert-only transactional table
 *       ({@code transactional=true}, {@code transactional_properties=insert_only}).
 *   <li>{@code acid-insert DB TBL commit|abort LOCALFILE [VAL...]}: what HiveServer2 does for an
 *       INSERT into an insert-only table: open_txns, allocate_table_write_ids, the file written to
 *       {@code delta_W_W_0000/000000_0} below the table or partition, add_write_notification_log
 *       with the file, its HDFS checksum and its delta directory, then commit_txn (or abort_txns:
 *       the file stays on HDFS, never valid).
 * </ul>
 *
 * <p>A transactional table's files in the oracle are those of committed write ids only (the
 * metastore's valid write id list for the table: at most its high watermark, not open or
 * aborted); the others are listed in {@code hidden}. With more than one catalog, an answer also
 * carries {@code sources}: the oracle of each catalog by name ({@code source} is the default
 * catalog's).
 *
 * <p>Exits when stdin closes or on quit; DIR is removed.
 */
public final class Launcher {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String PARQUET_IN =
      "org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat";
  private static final String PARQUET_OUT =
      "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat";
  private static final String PARQUET_SERDE =
      "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe";
  private static final String TEXT_IN = "org.apache.hadoop.mapred.TextInputFormat";
  private static final String TEXT_OUT =
      "org.apache.hadoop.hive.ql.io.HiveIgnoreKeyTextOutputFormat";
  private static final String TEXT_SERDE = "org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe";

  private final Configuration conf;
  private final FileSystem fs;
  private final HiveMetaStoreClient client;

  private Launcher(Configuration conf, FileSystem fs, HiveMetaStoreClient client) {
    this.conf = conf;
    this.fs = fs;
    this.client = client;
  }

  public static void main(String[] args) throws Exception {
    // Hive and Hadoop print to stdout in places; the protocol owns it.
    PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
        StandardCharsets.UTF_8);
    System.setOut(System.err);
    Map<String, String> opts = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        fail(out, "bad argument " + args[i]);
      }
      opts.put(args[i].substring(2), args[i + 1]);
    }
    for (String need :
        new String[] {"base-dir", "hdfs", "db-type", "jdbc-url", "db-user", "db-password",
          "scripts"}) {
      if (!opts.containsKey(need)) {
        fail(out, "missing --" + need);
      }
    }
    File base = new File(opts.get("base-dir"));
    File confDir = new File(base, "conf");
    confDir.mkdirs();
    String hdfs = opts.get("hdfs");
    String dbType = opts.get("db-type");
    String encoder = opts.getOrDefault("encoder", "json");
    String encoderClass;
    if (encoder.equals("json") && isHive3()) {
      // Hive 3.x: a message factory, not an encoder; no gzip one.
      encoderClass = "org.apache.hadoop.hive.metastore.messaging.json.JSONMessageFactory";
    } else if (encoder.equals("json")) {
      encoderClass = "org.apache.hadoop.hive.metastore.messaging.json.JSONMessageEncoder";
    } else if (encoder.equals("gzip") && !isHive3()) {
      encoderClass = "org.apache.hadoop.hive.metastore.messaging.json.gzip.GzipJSONMessageEncoder";
    } else {
      fail(out, "--encoder must be json or gzip, not " + encoder);
      return;
    }
    String driver =
        dbType.equals("postgres") ? "org.postgresql.Driver" : "org.mariadb.jdbc.Driver";
    String jdbcUrl = opts.get("jdbc-url");
    if (isHive3() && jdbcUrl.startsWith("jdbc:mariadb:")) {
      // DataNucleus 4.1 (Hive 3.1.3) picks its datastore adapter from the
      // driver's product name: Connector/J 3.x says "MariaDB", which it does
      // not know, and its generic adapter's `ESCAPE '\'` is an unterminated
      // string under MariaDB's backslash escapes. useMysqlMetadata makes the
      // driver say "MySQL" (DataNucleus's MySQLAdapter). Setting
      // datanucleus.rdbms.datastoreAdapterClassName does not work: 3.1.3's
      // ObjectStore passes DataNucleus only the ConfVars it lists.
      jdbcUrl += (jdbcUrl.contains("?") ? "&" : "?") + "useMysqlMetadata=true";
    }
    int port = freePort();
    String warehouse = hdfs + "/warehouse";
    String cmroot = hdfs + "/cmroot";

    Configuration conf = MetastoreConf.newMetastoreConf();
    conf.set("fs.defaultFS", hdfs);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.CONNECT_URL_KEY, jdbcUrl);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.CONNECTION_DRIVER, driver);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.CONNECTION_USER_NAME, opts.get("db-user"));
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.PWD, opts.get("db-password"));
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.WAREHOUSE, warehouse);
    conf.set("metastore.warehouse.external.dir", hdfs + "/external");
    if (opts.getOrDefault("translate-managed", "true").equals("false")) {
      // No metadata transformer: a non-ACID MANAGED_TABLE a client creates
      // stays managed, under the managed warehouse (Hive 4's default
      // MetastoreDefaultTransformer makes it an EXTERNAL_TABLE with
      // TRANSLATED_TO_EXTERNAL under the external warehouse).
      conf.set("metastore.metadata.transformer.class", " ");
    }
    // Hive 4.0.1: our listener (HCatalog's is not served for it); Hive 3.1.3:
    // HCatalog's own DbNotificationListener (see the two poms).
    String listener = opts.getOrDefault("listener", "stagefs.hms.NotificationLogListener");
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.TRANSACTIONAL_EVENT_LISTENERS, listener);
    // HiveConf.FIRE_EVENTS_FOR_DML: HiveServer2 fires INSERT events only with it on.
    conf.setBoolean("hive.metastore.dml.events", true);
    MetastoreConf.setBoolVar(conf, MetastoreConf.ConfVars.REPLCMENABLED, true);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.REPLCMDIR, cmroot);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.EVENT_MESSAGE_FACTORY, encoderClass);
    conf.setBoolean("metastore.metastore.event.db.notification.api.auth", false);
    conf.setBoolean("hive.metastore.event.db.notification.api.auth", false);
    MetastoreConf.setBoolVar(conf, MetastoreConf.ConfVars.SCHEMA_VERIFICATION, true);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.THRIFT_URIS, "thrift://127.0.0.1:" + port);
    MetastoreConf.setLongVar(conf, MetastoreConf.ConfVars.THRIFT_CONNECTION_RETRIES, 3);
    conf.setBoolean("hive.txn.stats.enabled", false);
    MetastoreConf.setVar(conf, MetastoreConf.ConfVars.HIVE_TXN_MANAGER,
        "org.apache.hadoop.hive.ql.lockmgr.DbTxnManager");
    MetastoreConf.setBoolVar(conf, MetastoreConf.ConfVars.HIVE_SUPPORT_CONCURRENCY, true);
    // No background compactor/housekeeping threads in a test.
    MetastoreConf.setBoolVar(conf, MetastoreConf.ConfVars.COMPACTOR_INITIATOR_ON, false);
    MetastoreConf.setBoolVar(conf, MetastoreConf.ConfVars.METRICS_ENABLED, false);
    if (isHive3()) {
      // Hive 3.1.3's defaults name hive-exec classes the standalone
      // metastore does not have: the partition expression proxy, and the
      // repl dump directory cleaner among the always-on tasks.
      conf.set("metastore.expression.proxy",
          "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy");
      List<String> tasks = new ArrayList<>();
      for (String task : MetastoreConf.getVar(conf, MetastoreConf.ConfVars.TASK_THREADS_ALWAYS)
          .split(",")) {
        if (!task.trim().isEmpty() && !task.contains("DumpDirCleanerTask")) {
          tasks.add(task.trim());
        }
      }
      MetastoreConf.setVar(conf, MetastoreConf.ConfVars.TASK_THREADS_ALWAYS,
          String.join(",", tasks));
    }
    // A metastore-site.xml for clients (and for the record).
    File site = new File(confDir, "metastore-site.xml");
    try (OutputStream o = Files.newOutputStream(site.toPath())) {
      Configuration toWrite = new Configuration(false);
      for (Map.Entry<String, String> e : conf) {
        if (e.getKey().startsWith("metastore.") || e.getKey().startsWith("hive.")
            || e.getKey().startsWith("javax.jdo") || e.getKey().equals("fs.defaultFS")) {
          toWrite.set(e.getKey(), e.getValue());
        }
      }
      toWrite.writeXml(o);
    }

    // 1. Hive's own schematool.
    String[] toolArgs = {
      "-dbType", dbType, "-initSchema", "-url", jdbcUrl, "-driver", driver,
      "-userName", opts.get("db-user"), "-passWord", opts.get("db-password")
    };
    int rc;
    try {
      rc = schemaTool(opts.get("scripts"), toolArgs, conf);
    } catch (Throwable t) {
      t.printStackTrace();
      fail(out, "schematool threw " + t);
      return;
    }
    if (rc != 0) {
      fail(out, "schematool -initSchema returned " + rc + " (see stderr)");
    }

    FileSystem fs = new Path(hdfs).getFileSystem(conf);
    fs.mkdirs(new Path(warehouse));
    fs.mkdirs(new Path(cmroot));

    // 2. The metastore's Thrift server, in this JVM.
    final Throwable[] died = new Throwable[1];
    Thread server = new Thread(() -> {
      try {
        HiveMetaStore.startMetaStore(port, HadoopThriftAuthBridge.getBridge(), conf);
      } catch (Throwable t) {
        died[0] = t;
        t.printStackTrace();
      }
    }, "metastore");
    server.setDaemon(true);
    server.start();
    long deadline = System.currentTimeMillis() + 120_000;
    while (!listening(port)) {
      if (died[0] != null) {
        fail(out, "the metastore did not start: " + died[0]);
      }
      if (System.currentTimeMillis() > deadline) {
        fail(out, "the metastore did not listen on " + port + " in 120 s");
      }
      Thread.sleep(100);
    }
    HiveMetaStoreClient client = new HiveMetaStoreClient(conf);
    Launcher l = new Launcher(conf, fs, client);

    ObjectNode ready = JSON.createObjectNode();
    ready.put("ready", true);
    ready.put("thrift_uri", "thrift://127.0.0.1:" + port);
    ready.put("hdfs", hdfs);
    ready.put("warehouse", warehouse);
    ready.put("cmroot", cmroot);
    ready.put("conf_dir", confDir.getAbsolutePath());
    ready.put("encoder", encoderClass);
    ready.put("hive_version", hiveVersion());
    ready.put("listener", listener);
    ready.put("event_id", client.getCurrentNotificationEventId().getEventId());
    out.println(JSON.writeValueAsString(ready));

    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isEmpty()) {
        continue;
      }
      List<String> w = Arrays.asList(line.split(" "));
      if (w.get(0).equals("quit")) {
        break;
      }
      ObjectNode reply;
      try {
        l.run(w);
        reply = JSON.createObjectNode();
        reply.put("ok", true);
        reply.put("event_id", client.getCurrentNotificationEventId().getEventId());
        reply.set("source", l.source(l.defaultCatalog()));
        List<String> cats = new ArrayList<>(client.getCatalogs());
        if (cats.size() > 1) {
          Collections.sort(cats);
          ObjectNode all = reply.putObject("sources");
          for (String cat : cats) {
            all.set(cat, l.source(cat));
          }
        }
      } catch (Throwable t) {
        t.printStackTrace();
        reply = JSON.createObjectNode();
        reply.put("ok", false);
        reply.put("error", String.valueOf(t));
      }
      out.println(JSON.writeValueAsString(reply));
    }
    client.close();
    try {
      fs.delete(new Path("/warehouse"), true);
    } catch (Exception e) {
      // the HDFS may be gone already
    }
    deleteTree(base);
    Runtime.getRuntime().halt(0);
  }

  private void run(List<String> w) throws Exception {
    String cmd = w.get(0);
    switch (cmd) {
      case "create-catalog": {
        need(w, 2);
        client.createCatalog(new Catalog(w.get(1), conf.get("fs.defaultFS") + "/catalogs/"
            + w.get(1)));
        break;
      }
      case "create-db": {
        need(w, 2);
        String[] cd = dbRef(w.get(1));
        Database db = new Database(cd[1], "", null, new HashMap<>());
        db.setCatalogName(cd[0]);
        if (w.size() > 2 && w.get(2).equals("repl-source")) {
          // A replication source (ALTER DATABASE ... SET DBPROPERTIES): the
          // metastore then recycles dropped and truncated files into cmroot.
          db.putToParameters(ReplChangeManager.SOURCE_OF_REPLICATION, "stagefs");
        }
        client.createDatabase(db);
        break;
      }
      case "alter-db-not-repl-source": {
        // Hive refuses to drop a database that is a replication source.
        need(w, 2);
        Database db = client.getDatabase(w.get(1));
        db.getParameters().remove(ReplChangeManager.SOURCE_OF_REPLICATION);
        client.alterDatabase(w.get(1), db);
        break;
      }
      case "drop-db":
        need(w, 2);
        client.dropDatabase(w.get(1), true, false,
            w.size() > 2 && w.get(2).equals("cascade"));
        break;
      case "create-table":
      case "create-acid-table": {
        need(w, 4);
        String[] cd = dbRef(w.get(1));
        Table t = new Table();
        t.setCatName(cd[0]);
        t.setDbName(cd[1]);
        t.setTableName(w.get(2));
        t.setOwner("stagefs");
        t.setTableType("MANAGED_TABLE");
        t.setParameters(new HashMap<>());
        if (cmd.equals("create-acid-table")) {
          hiveCapabilities();
          t.getParameters().put("transactional", "true");
          t.getParameters().put("transactional_properties", "insert_only");
        }
        StorageDescriptor sd = new StorageDescriptor();
        sd.setCols(new ArrayList<>(List.of(
            new FieldSchema("id", "int", null), new FieldSchema("v", "string", null))));
        SerDeInfo serde = new SerDeInfo();
        serde.setParameters(new HashMap<>());
        if (w.get(3).equals("parquet")) {
          sd.setInputFormat(PARQUET_IN);
          sd.setOutputFormat(PARQUET_OUT);
          serde.setSerializationLib(PARQUET_SERDE);
        } else if (w.get(3).equals("text")) {
          sd.setInputFormat(TEXT_IN);
          sd.setOutputFormat(TEXT_OUT);
          serde.setSerializationLib(TEXT_SERDE);
          serde.getParameters().put("field.delim", ",");
          serde.getParameters().put("serialization.format", ",");
        } else {
          throw new IllegalArgumentException("format must be parquet or text: " + w.get(3));
        }
        sd.setSerdeInfo(serde);
        sd.setBucketCols(new ArrayList<>());
        sd.setSortCols(new ArrayList<>());
        sd.setParameters(new HashMap<>());
        t.setSd(sd);
        List<FieldSchema> keys = new ArrayList<>();
        for (String k : w.subList(4, w.size())) {
          keys.add(new FieldSchema(k, "string", null));
        }
        t.setPartitionKeys(keys);
        client.createTable(t);
        break;
      }
      case "add-partition": {
        need(w, 4);
        String[] cd = dbRef(w.get(1));
        Table t = client.getTable(cd[0], cd[1], w.get(2));
        Partition p = new Partition();
        p.setCatName(t.getCatName());
        p.setDbName(t.getDbName());
        p.setTableName(t.getTableName());
        p.setValues(new ArrayList<>(w.subList(3, w.size())));
        StorageDescriptor sd = t.getSd().deepCopy();
        sd.setLocation(null);
        p.setSd(sd);
        p.setParameters(new HashMap<>());
        client.add_partition(p);
        break;
      }
      case "drop-partition": {
        need(w, 4);
        String[] cd = dbRef(w.get(1));
        client.dropPartition(cd[0], cd[1], w.get(2), new ArrayList<>(w.subList(3, w.size())),
            true);
        break;
      }
      case "insert":
        need(w, 5);
        insert(w.get(1), w.get(2), w.get(3), new File(w.get(4)),
            new ArrayList<>(w.subList(5, w.size())));
        break;
      case "rename": {
        need(w, 4);
        Table t = client.getTable(w.get(1), w.get(2));
        t.setTableName(w.get(3));
        client.alter_table(w.get(1), w.get(2), t);
        break;
      }
      case "truncate":
        need(w, 3);
        client.truncateTable(w.get(1), w.get(2),
            w.size() > 3 ? Collections.singletonList(partName(w.get(1), w.get(2),
                w.subList(3, w.size()))) : null);
        break;
      case "drop-table": {
        need(w, 3);
        String[] cd = dbRef(w.get(1));
        client.dropTable(cd[0], cd[1], w.get(2), true, false, false);
        break;
      }
      case "exchange":
        need(w, 6);
        exchange(w.get(1), w.get(2), w.get(3), w.get(4), new ArrayList<>(w.subList(5, w.size())));
        break;
      case "acid-insert":
        need(w, 5);
        acidInsert(w.get(1), w.get(2), w.get(3), new File(w.get(4)),
            new ArrayList<>(w.subList(5, w.size())));
        break;
      case "state":
        break;
      default:
        throw new IllegalArgumentException("unknown command " + cmd);
    }
  }

  private String partName(String db, String tbl, List<String> vals) throws Exception {
    Table t = client.getTable(db, tbl);
    List<String> parts = new ArrayList<>();
    for (int i = 0; i < vals.size(); i++) {
      parts.add(t.getPartitionKeys().get(i).getName() + "=" + vals.get(i));
    }
    return String.join("/", parts);
  }

  /** INSERT INTO / INSERT OVERWRITE as HiveServer2's Hive.loadTable/loadPartition does it. */
  private void insert(String db, String tbl, String mode, File local, List<String> vals)
      throws Exception {
    boolean overwrite;
    if (mode.equals("overwrite")) {
      overwrite = true;
    } else if (mode.equals("into")) {
      overwrite = false;
    } else {
      throw new IllegalArgumentException("mode must be into or overwrite: " + mode);
    }
    String[] cd = dbRef(db);
    Table t = client.getTable(cd[0], cd[1], tbl);
    Path dir = dirOf(t, vals);
    fs.mkdirs(dir);
    if (overwrite) {
      // Hive.replaceFiles -> cleanUpOneDirectoryForReplace: recycle, then delete.
      ReplChangeManager cm = ReplChangeManager.getInstance(conf);
      for (FileStatus st : fs.listStatus(dir)) {
        cm.recycle(st.getPath(), ReplChangeManager.RecycleType.MOVE, false);
        fs.delete(st.getPath(), true);
      }
    }
    // Hive's copy naming: 000000_0, then 000000_0_copy_1, ...
    Path target = new Path(dir, "000000_0");
    for (int n = 1; fs.exists(target); n++) {
      target = new Path(dir, "000000_0_copy_" + n);
    }
    fs.copyFromLocalFile(false, true, new Path(local.getAbsolutePath()), target);

    // Hive.fireInsertEvent -> addInsertFileInformation.
    InsertEventRequestData data = new InsertEventRequestData();
    data.setReplace(overwrite);
    FileStatus st = fs.getFileStatus(target);
    data.addToFilesAdded(st.getPath().toString());
    String checksum = ReplChangeManager.checksumFor(st.getPath(), fs);
    if (checksum != null) {
      data.addToFilesAddedChecksum(checksum);
    }
    FireEventRequest rq = new FireEventRequest(true, FireEventRequestData.insertData(data));
    rq.setCatName(cd[0]);
    rq.setDbName(cd[1]);
    rq.setTableName(tbl);
    if (!vals.isEmpty()) {
      rq.setPartitionVals(vals);
    }
    client.fireListenerEvent(rq);
  }

  /**
   * ALTER TABLE DESTDB.DESTTBL EXCHANGE PARTITION (k1=v1, ...) WITH TABLE SRCDB.SRCTBL as
   * HiveServer2 runs it (AlterTableExchangePartitionAnalyzer, then
   * Hive.exchangeTablePartitions): the values name the leading partition keys (a partial spec
   * exchanges every partition below it), transactional tables are refused as HiveServer2 refuses
   * them, and one exchange_partitions call does the rest: the metastore moves the partitions'
   * directory on HDFS from the source table's location to the destination's and, in one
   * metastore transaction, adds them to the destination and drops them from the source.
   */
  private void exchange(String srcDb, String srcTbl, String destDb, String destTbl,
      List<String> vals) throws Exception {
    String[] src = dbRef(srcDb);
    String[] dest = dbRef(destDb);
    Table source = client.getTable(src[0], src[1], srcTbl);
    Table target = client.getTable(dest[0], dest[1], destTbl);
    for (Table t : new Table[] {source, target}) {
      String on = t.getParameters() == null ? null : t.getParameters().get("transactional");
      if (on != null && on.equalsIgnoreCase("true")) {
        // ErrorMsg.EXCHANGE_PARTITION_NOT_ALLOWED_WITH_TRANSACTIONAL_TABLES
        throw new IllegalArgumentException(
            "Exchange partition is not allowed with transactional tables");
      }
    }
    if (vals.isEmpty() || vals.size() > source.getPartitionKeysSize()) {
      throw new IllegalArgumentException("give values for 1 to "
          + source.getPartitionKeysSize() + " leading partition keys");
    }
    Map<String, String> spec = new java.util.LinkedHashMap<>();
    for (int i = 0; i < vals.size(); i++) {
      spec.put(source.getPartitionKeys().get(i).getName(), vals.get(i));
    }
    // HiveServer2 calls the catalog-less overload, which names the default catalog.
    client.exchange_partitions(spec, src[0], src[1], srcTbl, dest[0], dest[1], destTbl);
  }

  private String defaultCatalog() {
    return MetaStoreUtils.getDefaultCatalog(conf);
  }

  /**
   * From the first transactional table on, this client declares the processor capabilities
   * HiveServer2 declares for itself (Hive 4's metadata transformer refuses to create, and hides,
   * ACID tables for a client without them). By reflection: 3.1.3's client has no capabilities.
   */
  private static void hiveCapabilities() throws Exception {
    Class<?> c = HiveMetaStoreClient.class;
    c.getMethod("setProcessorCapabilities", String[].class).invoke(null, (Object) new String[] {
      "EXTWRITE", "EXTREAD", "HIVEBUCKET2", "HIVEFULLACIDREAD", "HIVEFULLACIDWRITE",
      "HIVECACHEINVALIDATE", "HIVEMANAGESTATS", "HIVEMANAGEDINSERTWRITE",
      "HIVEMANAGEDINSERTREAD", "HIVESQL", "HIVEMQT", "HIVEONLYMQTWRITE"
    });
    c.getMethod("setProcessorIdentifier", String.class).invoke(null, "HIVESERVER2");
  }

  /** {@code DB} or {@code DB@CAT}: {catalog, database}. */
  private String[] dbRef(String ref) {
    int at = ref.indexOf('@');
    return at < 0
        ? new String[] {defaultCatalog(), ref}
        : new String[] {ref.substring(at + 1), ref.substring(0, at)};
  }

  /** The directory of a table, or of its partition with these values. */
  private Path dirOf(Table t, List<String> vals) throws Exception {
    if (t.getPartitionKeysSize() == 0) {
      return new Path(t.getSd().getLocation());
    }
    if (vals.size() != t.getPartitionKeysSize()) {
      throw new IllegalArgumentException("give a value for each partition key");
    }
    Partition p = client.getPartition(t.getCatName(), t.getDbName(), t.getTableName(), vals);
    return new Path(p.getSd().getLocation());
  }

  /**
   * An INSERT into an insert-only transactional table as HiveServer2 runs it (DbTxnManager,
   * MoveTask, Hive.addWriteNotificationLog): a transaction, a write id for the table, the file
   * under {@code delta_W_W_0000}, the write notification with the file's HDFS checksum and delta
   * directory, then commit (or abort).
   */
  private void acidInsert(String db, String tbl, String end, File local, List<String> vals)
      throws Exception {
    if (!end.equals("commit") && !end.equals("abort")) {
      throw new IllegalArgumentException("end must be commit or abort: " + end);
    }
    String[] cd = dbRef(db);
    if (!cd[0].equals(defaultCatalog())) {
      // 4.0.1's write notification request and transaction tables have no catalog.
      throw new IllegalArgumentException("transactions write into the default catalog only");
    }
    Table t = client.getTable(cd[0], cd[1], tbl);
    long txn = client.openTxn("stagefs");
    long writeId = client.allocateTableWriteId(txn, cd[1], tbl);
    String delta = String.format("delta_%07d_%07d_%04d", writeId, writeId, 0);
    Path dir = new Path(dirOf(t, vals), delta);
    fs.mkdirs(dir);
    Path target = new Path(dir, "000000_0");
    fs.copyFromLocalFile(false, true, new Path(local.getAbsolutePath()), target);

    InsertEventRequestData data = new InsertEventRequestData();
    data.setReplace(false);
    FileStatus st = fs.getFileStatus(target);
    data.addToFilesAdded(st.getPath().toString());
    String checksum = ReplChangeManager.checksumFor(st.getPath(), fs);
    if (checksum != null) {
      data.addToFilesAddedChecksum(checksum);
    }
    // By reflection: 3.1.3 (the same source, tests/java/hms3-launcher) has no write
    // notification log.
    InsertEventRequestData.class.getMethod("addToSubDirectoryList", String.class)
        .invoke(data, delta);
    Class<?> rqc = Class.forName("org.apache.hadoop.hive.metastore.api.WriteNotificationLogRequest");
    Object rq = rqc.getConstructor(long.class, long.class, String.class, String.class,
        InsertEventRequestData.class).newInstance(txn, writeId, cd[1], tbl, data);
    if (!vals.isEmpty()) {
      rqc.getMethod("setPartitionVals", List.class).invoke(rq, vals);
    }
    client.getClass().getMethod("addWriteNotificationLog", rqc).invoke(client, rq);
    if (end.equals("commit")) {
      client.commitTxn(txn);
    } else {
      client.abortTxns(Collections.singletonList(txn));
    }
  }

  /** A transactional table's valid write ids (null for any other table). */
  private TableValidWriteIds writeIds(Table t) throws Exception {
    String on = t.getParameters() == null ? null : t.getParameters().get("transactional");
    if (on == null || !on.equalsIgnoreCase("true")) {
      return null;
    }
    String full = t.getDbName() + "." + t.getTableName();
    return client.getValidWriteIds(Collections.singletonList(full),
        client.getValidTxns().writeToString()).get(0);
  }

  /** Every table of a catalog: its location, keys, partitions and files. */
  private ObjectNode source(String cat) throws Exception {
    ObjectNode tables = JSON.createObjectNode();
    List<String> dbs = new ArrayList<>(client.getAllDatabases(cat));
    Collections.sort(dbs);
    for (String db : dbs) {
      List<String> names = new ArrayList<>(client.getAllTables(cat, db));
      Collections.sort(names);
      for (String name : names) {
        Table t = client.getTable(cat, db, name);
        TableValidWriteIds ids = writeIds(t);
        ObjectNode tn = JSON.createObjectNode();
        tn.put("location", t.getSd().getLocation());
        tn.put("table_type", t.getTableType());
        tn.put("input_format", t.getSd().getInputFormat());
        ArrayNode keys = tn.putArray("partition_keys");
        for (FieldSchema k : t.getPartitionKeys()) {
          keys.add(k.getName());
        }
        if (t.getPartitionKeysSize() == 0) {
          tn.set("files", files(t.getSd().getLocation(), tn.putArray("hidden"), ids));
        } else {
          ArrayNode parts = tn.putArray("partitions");
          List<Partition> ps = client.listPartitions(cat, db, name, -1);
          ps.sort((a, b) -> String.join("/", a.getValues()).compareTo(
              String.join("/", b.getValues())));
          for (Partition p : ps) {
            ObjectNode pn = parts.addObject();
            ArrayNode values = pn.putArray("values");
            p.getValues().forEach(values::add);
            pn.put("location", p.getSd().getLocation());
            pn.set("files", files(p.getSd().getLocation(), pn.putArray("hidden"), ids));
          }
        }
        tables.set(db + "." + name, tn);
      }
    }
    return tables;
  }

  /**
   * The files below {@code location} a Hive reader reads: names starting with {@code _} or
   * {@code .} at any level below it (staging directories, {@code _SUCCESS}) are skipped, as
   * Hive's FileUtils.HIDDEN_FILES_PATH_FILTER skips them, and their paths listed in {@code
   * hidden}.
   */
  private ArrayNode files(String location, ArrayNode hidden, TableValidWriteIds ids)
      throws Exception {
    ArrayNode out = JSON.createArrayNode();
    Path dir = new Path(location);
    if (!fs.exists(dir)) {
      return out;
    }
    List<LocatedFileStatus> all = new ArrayList<>();
    RemoteIterator<LocatedFileStatus> it = fs.listFiles(dir, true);
    while (it.hasNext()) {
      all.add(it.next());
    }
    all.sort((a, b) -> a.getPath().toString().compareTo(b.getPath().toString()));
    String base = fs.makeQualified(dir).toUri().getPath();
    for (LocatedFileStatus st : all) {
      String rel = st.getPath().toUri().getPath().substring(base.length());
      if (rel.contains("/_") || rel.contains("/.") || (ids != null && !committed(rel, ids))) {
        hidden.add(st.getPath().toString());
        continue;
      }
      ObjectNode f = out.addObject();
      f.put("path", st.getPath().toString());
      f.put("len", st.getLen());
      f.put("checksum", ReplChangeManager.checksumFor(st.getPath(), fs));
      f.put("sha256", sha256(st.getPath()));
    }
    return out;
  }

  /**
   * Whether a file of a transactional table ({@code /delta_A_B_S/name} below its location) was
   * written by committed write ids only: each id from A to B at most the table's high watermark
   * and not among its invalid (open or aborted) ids. A file outside a delta directory is not.
   */
  private static boolean committed(String rel, TableValidWriteIds ids) {
    String[] parts = rel.split("/");
    if (parts.length < 3 || !parts[parts.length - 2].startsWith("delta_")) {
      return false;
    }
    String[] range = parts[parts.length - 2].split("_");
    long lo = Long.parseLong(range[1]);
    long hi = Long.parseLong(range[2]);
    for (long id = lo; id <= hi; id++) {
      if (id > ids.getWriteIdHighWaterMark() || ids.getInvalidWriteIds().contains(id)) {
        return false;
      }
    }
    return true;
  }

  /** The file's bytes as HDFS serves them, hashed (lower-case hex). */
  private String sha256(Path p) throws Exception {
    java.security.MessageDigest md = java.security.MessageDigest.getInstance("SHA-256");
    byte[] buf = new byte[65536];
    try (java.io.InputStream in = fs.open(p)) {
      for (int n; (n = in.read(buf)) > 0; ) {
        md.update(buf, 0, n);
      }
    }
    StringBuilder hex = new StringBuilder();
    for (byte b : md.digest()) {
      hex.append(String.format("%02x", b));
    }
    return hex.toString();
  }

  private static void need(List<String> w, int n) {
    if (w.size() < n) {
      throw new IllegalArgumentException(w.get(0) + " needs " + (n - 1) + " arguments");
    }
  }

  /** Hive 3.x's standalone metastore: its schematool is in metastore.tools. */
  private static boolean isHive3() {
    return hiveVersion().startsWith("3.");
  }

  /** The metastore's version, from the jar both 3.x and 4.x ship it in. */
  private static String hiveVersion() {
    try {
      return (String) Class.forName("org.apache.hadoop.hive.metastore.utils.MetastoreVersionInfo")
          .getMethod("getVersion").invoke(null);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("no MetastoreVersionInfo: " + e);
    }
  }

  /**
   * Runs MetastoreSchemaTool (4.x: metastore.tools.schematool, run(home, args, options, conf);
   * 3.x: metastore.tools, static run(args)), so one launcher source builds against either.
   */
  private static int schemaTool(String home, String[] args, Configuration conf) throws Exception {
    String name = isHive3()
        ? "org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool"
        : "org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool";
    Class<?> tool = Class.forName(name);
    if (isHive3()) {
      // 3.x: a static run(args), the scripts' home in a static field.
      tool.getField("homeDir").set(null, home);
      return (Integer) tool.getMethod("run", String[].class).invoke(null, (Object) args);
    }
    Class<?> group = Class.forName("org.apache.commons.cli.OptionGroup");
    Object result = tool.getMethod("run", String.class, String[].class, group, Configuration.class)
        .invoke(tool.getDeclaredConstructor().newInstance(), home, args, null, conf);
    return (Integer) result;
  }

  private static int freePort() throws Exception {
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      return s.getLocalPort();
    }
  }

  private static boolean listening(int port) {
    try (Socket s = new Socket()) {
      s.connect(new InetSocketAddress("127.0.0.1", port), 200);
      return true;
    } catch (Exception e) {
      return false;
    }
  }

  private static void fail(PrintStream out, String why) {
    ObjectNode n = JSON.createObjectNode();
    n.put("ready", false);
    n.put("error", why);
    try {
      out.println(JSON.writeValueAsString(n));
    } catch (Exception e) {
      out.println("{\"ready\":false}");
    }
    out.flush();
    Runtime.getRuntime().halt(1);
  }

  private static void deleteTree(File f) {
    File[] kids = f.listFiles();
    if (kids != null) {
      for (File k : kids) {
        deleteTree(k);
      }
    }
    f.delete();
  }
}
