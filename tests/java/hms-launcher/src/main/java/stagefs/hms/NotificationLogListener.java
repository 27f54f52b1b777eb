package stagefs.hms;

import java.io.IOException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.hive.metastore.HMSHandler;
import org.apache.hadoop.hive.metastore.MetaStoreEventListenerConstants;
import org.apache.hadoop.hive.metastore.ReplChangeManager;
import org.apache.hadoop.hive.metastore.TransactionalMetaStoreEventListener;
import org.apache.hadoop.hive.metastore.Warehouse;
import org.apache.hadoop.hive.metastore.api.Catalog;
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.NotificationEvent;
import org.apache.hadoop.hive.metastore.api.Partition;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.events.AbortTxnEvent;
import org.apache.hadoop.hive.metastore.events.AcidWriteEvent;
import org.apache.hadoop.hive.metastore.events.AddPartitionEvent;
import org.apache.hadoop.hive.metastore.events.AllocWriteIdEvent;
import org.apache.hadoop.hive.metastore.events.CommitTxnEvent;
import org.apache.hadoop.hive.metastore.events.CreateCatalogEvent;
import org.apache.hadoop.hive.metastore.events.AlterDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.AlterPartitionEvent;
import org.apache.hadoop.hive.metastore.events.AlterTableEvent;
import org.apache.hadoop.hive.metastore.events.CreateDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.CreateTableEvent;
import org.apache.hadoop.hive.metastore.events.DropDatabaseEvent;
import org.apache.hadoop.hive.metastore.events.DropPartitionEvent;
import org.apache.hadoop.hive.metastore.events.DropTableEvent;
import org.apache.hadoop.hive.metastore.events.InsertEvent;
import org.apache.hadoop.hive.metastore.events.ListenerEvent;
import org.apache.hadoop.hive.metastore.events.OpenTxnEvent;
import org.apache.hadoop.hive.metastore.messaging.AcidWriteMessage;
import org.apache.hadoop.hive.metastore.messaging.EventMessage;
import org.apache.hadoop.hive.metastore.messaging.EventMessage.EventType;
import org.apache.hadoop.hive.metastore.messaging.MessageBuilder;
import org.apache.hadoop.hive.metastore.messaging.MessageEncoder;
import org.apache.hadoop.hive.metastore.messaging.MessageFactory;
import org.apache.hadoop.hive.metastore.messaging.PartitionFiles;
import org.apache.hadoop.hive.metastore.tools.SQLGenerator;
import org.apache.hadoop.hive.metastore.txn.TxnUtils;
import org.apache.hadoop.hive.metastore.utils.MetaStoreUtils;

/**
 * The metastore's NOTIFICATION_LOG writer in these tests, in the place of HCatalog's
 * DbNotificationListener (which Maven Central does not serve for the 4.0.x metastore: see
 * docs/HIVE.md, "The notification listener").
 *
 * <p>Written for stagefs against the metastore's public listener API. Everything that decides what
 * a row holds is the metastore's own code: the message is built by the metastore's {@link
 * MessageBuilder} and serialized by the configured {@link MessageEncoder} (JSON or gzip), file URIs
 * are encoded by {@link ReplChangeManager#encodeFileUri} with the HDFS checksum from {@link
 * ReplChangeManager#checksumFor}, and the row is inserted (its id taken from NOTIFICATION_SEQUENCE)
 * by the metastore's RawStore inside the transaction of the change it records, as a transactional
 * listener is called. This class only picks the message for each event and the row's catalog,
 * database and table names.
 *
 * <p>It records the events the test driver causes: catalogs and databases created, tables and
 * partitions created, altered (rename, truncate) and dropped, INSERT, and the transaction events
 * the metastore's transaction handler fires on its own JDBC connection (OPEN_TXN, COMMIT_TXN,
 * ABORT_TXN, ALLOC_WRITE_ID, ACID_WRITE). Those are written as Hive's DbNotificationListener writes
 * them: with plain SQL on the connection and in the transaction the handler passes, the row's
 * EVENT_ID taken from NOTIFICATION_SEQUENCE and its NL_ID from SEQUENCE_TABLE, each read FOR UPDATE
 * through the handler's {@link SQLGenerator}; an ACID_WRITE becomes a TXN_WRITE_NOTIFICATION_LOG
 * row (the files of one transaction in one table or partition, merged into the row already there)
 * and no NOTIFICATION_LOG row. Transaction events carry no catalog (CAT_NAME NULL). It runs no
 * cleaner of old rows.
 */
public final class NotificationLogListener extends TransactionalMetaStoreEventListener {
  private final MessageEncoder encoder;

  public NotificationLogListener(Configuration conf) {
    super(conf);
    encoder = MessageFactory.getDefaultInstance(conf);
  }

  @Override
  public void onCreateCatalog(CreateCatalogEvent e) throws MetaException {
    Catalog cat = e.getCatalog();
    write(e, EventType.CREATE_CATALOG, MessageBuilder.getInstance().buildCreateCatalogMessage(cat),
        cat.getName(), null, null);
  }

  @Override
  public void onOpenTxn(OpenTxnEvent e, Connection db, SQLGenerator sql) throws MetaException {
    List<Long> ids = e.getTxnIds();
    writeDirect(e, EventType.OPEN_TXN,
        MessageBuilder.getInstance().buildOpenTxnMessage(ids.get(0), ids.get(ids.size() - 1)),
        null, null, db, sql);
  }

  @Override
  public void onCommitTxn(CommitTxnEvent e, Connection db, SQLGenerator sql) throws MetaException {
    writeDirect(e, EventType.COMMIT_TXN,
        MessageBuilder.getInstance().buildCommitTxnMessage(e.getTxnId()), null, null, db, sql);
  }

  @Override
  public void onAbortTxn(AbortTxnEvent e, Connection db, SQLGenerator sql) throws MetaException {
    writeDirect(e, EventType.ABORT_TXN,
        MessageBuilder.getInstance().buildAbortTxnMessage(e.getTxnId(), e.getDbsUpdated()), null,
        null, db, sql);
  }

  @Override
  public void onAllocWriteId(AllocWriteIdEvent e, Connection db, SQLGenerator sql)
      throws MetaException {
    writeDirect(e, EventType.ALLOC_WRITE_ID,
        MessageBuilder.getInstance().buildAllocWriteIdMessage(e.getTxnToWriteIdList(),
            e.getDbName(), e.getTableName()),
        e.getDbName(), e.getTableName(), db, sql);
  }

  /**
   * The files one transaction wrote into one table or partition: a TXN_WRITE_NOTIFICATION_LOG row
   * (WNL_FILES the encoded file URIs joined by ReplChangeManager's separator, WNL_TABLE_OBJ and
   * WNL_PARTITION_OBJ the message's Thrift-JSON objects), merged into the row of the same
   * transaction, table and partition when there is one.
   */
  @Override
  public void onAcidWrite(AcidWriteEvent e, Connection db, SQLGenerator sql) throws MetaException {
    List<String> files = e.getFiles();
    List<String> sums = e.getChecksums();
    List<String> dirs = e.getSubDirs();
    if (sums != null && !sums.isEmpty() && sums.size() != files.size()) {
      throw new MetaException("ACID_WRITE: " + files.size() + " files, " + sums.size()
          + " checksums");
    }
    List<String> uris = new ArrayList<>();
    for (int i = 0; i < files.size(); i++) {
      String sum = sums != null && !sums.isEmpty() ? sums.get(i) : null;
      String dir = dirs != null && dirs.size() > i ? dirs.get(i) : null;
      try {
        uris.add(ReplChangeManager.getInstance(getConf()).encodeFileUri(files.get(i), sum, dir));
      } catch (IOException io) {
        throw new MetaException("encoding " + files.get(i) + ": " + io);
      }
    }
    AcidWriteMessage msg =
        MessageBuilder.getInstance().buildAcidWriteMessage(e, uris.iterator());
    if (db == null || sql == null) {
      throw new MetaException("ACID_WRITE without the transaction handler's connection");
    }
    try {
      prepare(db, sql);
      String joined = ReplChangeManager.joinWithSeparator(msg.getFiles());
      Long found = null;
      String had = null;
      try (PreparedStatement st = db.prepareStatement(sql.addForUpdateClause(
          "SELECT \"WNL_ID\", \"WNL_FILES\" FROM \"TXN_WRITE_NOTIFICATION_LOG\" WHERE "
              + "\"WNL_DATABASE\" = ? AND \"WNL_TABLE\" = ? AND \"WNL_PARTITION\" = ? AND "
              + "\"WNL_TXNID\" = ?"))) {
        st.setString(1, e.getDatabase());
        st.setString(2, e.getTable());
        st.setString(3, e.getPartition());
        st.setLong(4, e.getTxnId());
        try (ResultSet rs = st.executeQuery()) {
          if (rs.next()) {
            found = rs.getLong(1);
            had = rs.getString(2);
          }
        }
      }
      int now = (int) (System.currentTimeMillis() / 1000);
      if (found == null) {
        long id = nextValue(db, sql,
            "org.apache.hadoop.hive.metastore.model.MTxnWriteNotificationLog");
        try (PreparedStatement st = db.prepareStatement(
            "INSERT INTO \"TXN_WRITE_NOTIFICATION_LOG\" (\"WNL_ID\", \"WNL_TXNID\", "
                + "\"WNL_WRITEID\", \"WNL_DATABASE\", \"WNL_TABLE\", \"WNL_PARTITION\", "
                + "\"WNL_TABLE_OBJ\", \"WNL_PARTITION_OBJ\", \"WNL_FILES\", \"WNL_EVENT_TIME\") "
                + "VALUES (?,?,?,?,?,?,?,?,?,?)")) {
          st.setLong(1, id);
          st.setLong(2, e.getTxnId());
          st.setLong(3, e.getWriteId());
          st.setString(4, e.getDatabase());
          st.setString(5, e.getTable());
          st.setString(6, e.getPartition());
          st.setString(7, msg.getTableObjStr());
          st.setString(8, msg.getPartitionObjStr());
          st.setString(9, joined);
          st.setInt(10, now);
          st.executeUpdate();
        }
      } else if (had == null || !had.contains(joined)) {
        List<String> both = new ArrayList<>();
        both.add(joined);
        if (had != null) {
          both.add(had);
        }
        try (PreparedStatement st = db.prepareStatement(
            "UPDATE \"TXN_WRITE_NOTIFICATION_LOG\" SET \"WNL_TABLE_OBJ\" = ?, "
                + "\"WNL_PARTITION_OBJ\" = ?, \"WNL_FILES\" = ?, \"WNL_EVENT_TIME\" = ? "
                + "WHERE \"WNL_ID\" = ?")) {
          st.setString(1, msg.getTableObjStr());
          st.setString(2, msg.getPartitionObjStr());
          st.setString(3, ReplChangeManager.joinWithSeparator(both));
          st.setInt(4, now);
          st.setLong(5, found);
          st.executeUpdate();
        }
      }
    } catch (SQLException ex) {
      throw new MetaException("writing TXN_WRITE_NOTIFICATION_LOG: " + ex);
    }
  }

  @Override
  public void onCreateDatabase(CreateDatabaseEvent e) throws MetaException {
    Database db = e.getDatabase();
    write(e, EventType.CREATE_DATABASE, MessageBuilder.getInstance().buildCreateDatabaseMessage(db),
        db.getCatalogName(), db.getName(), null);
  }

  @Override
  public void onAlterDatabase(AlterDatabaseEvent e) throws MetaException {
    Database old = e.getOldDatabase();
    write(e, EventType.ALTER_DATABASE,
        MessageBuilder.getInstance().buildAlterDatabaseMessage(old, e.getNewDatabase()),
        old.getCatalogName(), old.getName(), null);
  }

  @Override
  public void onDropDatabase(DropDatabaseEvent e) throws MetaException {
    Database db = e.getDatabase();
    write(e, EventType.DROP_DATABASE, MessageBuilder.getInstance().buildDropDatabaseMessage(db),
        db.getCatalogName(), db.getName(), null);
  }

  @Override
  public void onCreateTable(CreateTableEvent e) throws MetaException {
    Table t = e.getTable();
    Iterator<String> files =
        MetaStoreUtils.isExternalTable(t) ? null : filesOf(t.getSd().getLocation()).iterator();
    write(e, EventType.CREATE_TABLE, MessageBuilder.getInstance().buildCreateTableMessage(t, files),
        t.getCatName(), t.getDbName(), t.getTableName());
  }

  @Override
  public void onAlterTable(AlterTableEvent e) throws MetaException {
    Table after = e.getNewTable();
    write(e, EventType.ALTER_TABLE,
        MessageBuilder.getInstance().buildAlterTableMessage(e.getOldTable(), after,
            e.getIsTruncateOp(), e.getWriteId()),
        after.getCatName(), after.getDbName(), after.getTableName());
  }

  @Override
  public void onDropTable(DropTableEvent e) throws MetaException {
    Table t = e.getTable();
    write(e, EventType.DROP_TABLE, MessageBuilder.getInstance().buildDropTableMessage(t),
        t.getCatName(), t.getDbName(), t.getTableName());
  }

  @Override
  public void onAddPartition(AddPartitionEvent e) throws MetaException {
    Table t = e.getTable();
    Iterator<PartitionFiles> files = null;
    if (!MetaStoreUtils.isExternalTable(t)) {
      // A transactional table's files travel with its ACID_WRITE events instead.
      boolean acid = TxnUtils.isTransactionalTable(t);
      List<PartitionFiles> all = new ArrayList<>();
      Iterator<Partition> parts = e.getPartitionIterator();
      while (parts.hasNext()) {
        Partition p = parts.next();
        List<String> names =
            acid ? Collections.emptyList() : filesOf(p.getSd().getLocation());
        all.add(new PartitionFiles(Warehouse.makePartName(t.getPartitionKeys(), p.getValues()),
            names.iterator()));
      }
      files = all.iterator();
    }
    write(e, EventType.ADD_PARTITION,
        MessageBuilder.getInstance().buildAddPartitionMessage(t, e.getPartitionIterator(), files),
        t.getCatName(), t.getDbName(), t.getTableName());
  }

  @Override
  public void onAlterPartition(AlterPartitionEvent e) throws MetaException {
    Partition before = e.getOldPartition();
    write(e, EventType.ALTER_PARTITION,
        MessageBuilder.getInstance().buildAlterPartitionMessage(e.getTable(), before,
            e.getNewPartition(), e.getIsTruncateOp(), e.getWriteId()),
        before.getCatName(), before.getDbName(), before.getTableName());
  }

  @Override
  public void onDropPartition(DropPartitionEvent e) throws MetaException {
    Table t = e.getTable();
    write(e, EventType.DROP_PARTITION,
        MessageBuilder.getInstance().buildDropPartitionMessage(t, e.getPartitionIterator()),
        t.getCatName(), t.getDbName(), t.getTableName());
  }

  @Override
  public void onInsert(InsertEvent e) throws MetaException {
    Table t = e.getTableObj();
    List<String> files = e.getFiles();
    List<String> sums = e.getFileChecksums();
    List<String> uris = new ArrayList<>();
    for (int i = 0; i < files.size(); i++) {
      String sum = sums != null && !sums.isEmpty() ? sums.get(i) : null;
      uris.add(encode(files.get(i), sum));
    }
    write(e, EventType.INSERT,
        MessageBuilder.getInstance().buildInsertMessage(t, e.getPartitionObj(), e.isReplace(),
            uris.iterator()),
        t.getCatName(), t.getDbName(), t.getTableName());
  }

  /** The visible files directly under a location, each as an encoded file URI. */
  private List<String> filesOf(String location) throws MetaException {
    List<String> out = new ArrayList<>();
    if (location == null) {
      return out;
    }
    try {
      Path dir = new Path(location);
      FileSystem fs = dir.getFileSystem(getConf());
      for (FileStatus st : fs.listStatus(dir)) {
        String name = st.getPath().getName();
        if (!st.isFile() || name.startsWith("_") || name.startsWith(".")) {
          continue;
        }
        out.add(encode(st.getPath().toString(), ReplChangeManager.checksumFor(st.getPath(), fs)));
      }
    } catch (java.io.FileNotFoundException missing) {
      return out;
    } catch (IOException io) {
      throw new MetaException("listing " + location + ": " + io);
    }
    return out;
  }

  private String encode(String file, String checksum) throws MetaException {
    try {
      return ReplChangeManager.getInstance(getConf()).encodeFileUri(file, checksum, null);
    } catch (IOException io) {
      throw new MetaException("encoding " + file + ": " + io);
    }
  }

  /** MySQL/MariaDB: the statements below quote names with double quotes. */
  private static void prepare(Connection db, SQLGenerator sql) throws SQLException {
    if (sql.getDbProduct().isMYSQL()) {
      try (Statement st = db.createStatement()) {
        st.execute("SET @@session.sql_mode=ANSI_QUOTES");
      }
    }
  }

  /** The next value of a DataNucleus id sequence (SEQUENCE_TABLE), read FOR UPDATE and bumped. */
  private static long nextValue(Connection db, SQLGenerator sql, String sequence)
      throws SQLException, MetaException {
    Long next = null;
    try (PreparedStatement st = db.prepareStatement(sql.addForUpdateClause(
        "SELECT \"NEXT_VAL\" FROM \"SEQUENCE_TABLE\" WHERE \"SEQUENCE_NAME\" = ?"))) {
      st.setString(1, sequence);
      try (ResultSet rs = st.executeQuery()) {
        if (rs.next()) {
          next = rs.getLong(1);
        }
      }
    }
    if (next == null) {
      throw new MetaException("SEQUENCE_TABLE has no row for " + sequence);
    }
    try (PreparedStatement st = db.prepareStatement(
        "UPDATE \"SEQUENCE_TABLE\" SET \"NEXT_VAL\" = ? WHERE \"SEQUENCE_NAME\" = ?")) {
      st.setLong(1, next + 1);
      st.setString(2, sequence);
      st.executeUpdate();
    }
    return next;
  }

  /**
   * A NOTIFICATION_LOG row written with plain SQL on the transaction handler's connection, in its
   * transaction: EVENT_ID from NOTIFICATION_SEQUENCE, NL_ID from SEQUENCE_TABLE, both read FOR
   * UPDATE. Without a connection (a caller outside the transaction handler) the RawStore writes it.
   */
  private void writeDirect(ListenerEvent cause, EventType type, EventMessage msg, String dbName,
      String table, Connection db, SQLGenerator sql) throws MetaException {
    if (db == null || sql == null) {
      write(cause, type, msg, null, dbName, table);
      return;
    }
    int now = (int) (System.currentTimeMillis() / 1000);
    try {
      prepare(db, sql);
      if (sql.getDbProduct().isDERBY()) {
        try (Statement st = db.createStatement()) {
          st.execute(sql.lockTable("NOTIFICATION_SEQUENCE", false));
        }
      }
      Long eventId = null;
      try (Statement st = db.createStatement();
          ResultSet rs = st.executeQuery(sql.addForUpdateClause(
              "SELECT \"NEXT_EVENT_ID\" FROM \"NOTIFICATION_SEQUENCE\""))) {
        if (rs.next()) {
          eventId = rs.getLong(1);
        }
      }
      if (eventId == null) {
        throw new MetaException("NOTIFICATION_SEQUENCE is empty");
      }
      try (PreparedStatement st =
          db.prepareStatement("UPDATE \"NOTIFICATION_SEQUENCE\" SET \"NEXT_EVENT_ID\" = ?")) {
        st.setLong(1, eventId + 1);
        st.executeUpdate();
      }
      long nlId = nextValue(db, sql, "org.apache.hadoop.hive.metastore.model.MNotificationLog");
      try (PreparedStatement st = db.prepareStatement(
          "INSERT INTO \"NOTIFICATION_LOG\" (\"NL_ID\", \"EVENT_ID\", \"EVENT_TIME\", "
              + "\"EVENT_TYPE\", \"MESSAGE\", \"MESSAGE_FORMAT\", \"DB_NAME\", \"TBL_NAME\", "
              + "\"CAT_NAME\") VALUES (?,?,?,?,?,?,?,?,?)")) {
        st.setLong(1, nlId);
        st.setLong(2, eventId);
        st.setLong(3, now);
        st.setString(4, type.toString());
        st.setString(5, encoder.getSerializer().serialize(msg));
        st.setString(6, encoder.getMessageFormat());
        st.setString(7, dbName);
        st.setString(8, table);
        st.setString(9, null);
        st.executeUpdate();
      }
      cause.putParameter(MetaStoreEventListenerConstants.DB_NOTIFICATION_EVENT_ID_KEY_NAME,
          Long.toString(eventId));
    } catch (SQLException ex) {
      throw new MetaException("writing the " + type + " notification: " + ex);
    }
  }

  private void write(ListenerEvent cause, EventType type, EventMessage msg, String cat, String db,
      String table) throws MetaException {
    NotificationEvent row = new NotificationEvent(0, (int) (System.currentTimeMillis() / 1000),
        type.toString(), encoder.getSerializer().serialize(msg));
    row.setCatName(cat != null ? cat : MetaStoreUtils.getDefaultCatalog(getConf()));
    row.setDbName(db);
    if (table != null) {
      row.setTableName(table);
    }
    row.setMessageFormat(encoder.getMessageFormat());
    HMSHandler.getMSForConf(getConf()).addNotificationEvent(row);
    if (row.isSetEventId()) {
      // Later listeners of the same change read the id the row got.
      cause.putParameter(MetaStoreEventListenerConstants.DB_NOTIFICATION_EVENT_ID_KEY_NAME,
          Long.toString(row.getEventId()));
    }
  }
}
