package stagefs.hms;

import java.io.IOException;
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
import org.apache.hadoop.hive.metastore.api.Database;
import org.apache.hadoop.hive.metastore.api.MetaException;
import org.apache.hadoop.hive.metastore.api.NotificationEvent;
import org.apache.hadoop.hive.metastore.api.Partition;
import org.apache.hadoop.hive.metastore.api.Table;
import org.apache.hadoop.hive.metastore.events.AddPartitionEvent;
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
import org.apache.hadoop.hive.metastore.messaging.EventMessage;
import org.apache.hadoop.hive.metastore.messaging.EventMessage.EventType;
import org.apache.hadoop.hive.metastore.messaging.MessageBuilder;
import org.apache.hadoop.hive.metastore.messaging.MessageEncoder;
import org.apache.hadoop.hive.metastore.messaging.MessageFactory;
import org.apache.hadoop.hive.metastore.messaging.PartitionFiles;
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
 * <p>It records the events the test driver causes: databases, tables and partitions created,
 * altered (rename, truncate) and dropped, and INSERT. It writes no transaction events (OPEN_TXN,
 * COMMIT_TXN, ALLOC_WRITE_ID, ACID_WRITE: those go through the transaction handler's own JDBC
 * connection) and runs no cleaner of old rows.
 */
public final class NotificationLogListener extends TransactionalMetaStoreEventListener {
  private final MessageEncoder encoder;

  public NotificationLogListener(Configuration conf) {
    super(conf);
    encoder = MessageFactory.getDefaultInstance(conf);
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
