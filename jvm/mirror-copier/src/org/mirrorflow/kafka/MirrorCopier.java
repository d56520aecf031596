package org.mirrorflow.kafka;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetOutOfRangeException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.Dependency;
import org.apache.spark.Partition;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.execution.RDDScanExec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.datasources.v2.DataSourceRDD;
import org.apache.spark.sql.execution.datasources.v2.DataSourceRDDPartition;
import org.apache.spark.sql.execution.datasources.v2.MicroBatchScanExec;
import org.apache.spark.sql.kafka010.KafkaBatchInputPartition;
import org.apache.spark.sql.kafka010.KafkaOffsetRange;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.jdk.javaapi.CollectionConverters;

/**
 * mirrorflow's at-least-once copy: Spark's Kafka source plans each micro-batch (which offsets of
 * which partitions, kept in the query's checkpoint), and the executors copy those offset ranges
 * with Kafka's own Java clients, record for record, without turning them into Spark rows.
 *
 * <p>Each copy keeps its source record's partition, key, value, headers and timestamp. The
 * acknowledgement of each copy gives its exact downstream offset to the {@link OffsetSyncWriter}.
 * A task ends when every copy of its range is acknowledged; a failed copy fails the task, so
 * Spark never commits a micro-batch whose copies are not all on the target.
 *
 * <p>The settings are one flat map of strings: {@code consumer.*} and {@code producer.*} (Java
 * client properties of the source consumer and the target producer), {@code topic.<source>}
 * (the remote name of each topic to copy), {@code limit.<remote>} (its {@code
 * max.message.bytes}), {@code record.overhead}, {@code source}, {@code target} (the clusters'
 * aliases), {@code error.prefix} (what starts the messages the mirror job turns into one line
 * for its user), {@code source.principal}, {@code target.principal}, {@code poll.timeout.ms}, and,
 * when offset syncs are written, {@code syncs.topic}, {@code syncs.lag.max}, {@code
 * syncs.interval.ms}, {@code syncs.producer.*}, {@code syncs} (the cluster they go to) and
 * {@code syncs.principal}.
 */
public final class MirrorCopier {

  private static final Logger LOG = LoggerFactory.getLogger(MirrorCopier.class);

  private MirrorCopier() {}

  /**
   * The offset ranges Spark's Kafka source planned for a micro-batch, as {@code
   * topic\tpartition\tfrom\tuntil} (empty ranges left out). {@code batch} is the DataFrame
   * {@code foreachBatch} was given: its plan scans the RDD of the micro-batch's own plan, whose
   * partitions are the source's input partitions. Nothing is read.
   */
  public static List<String> plannedRanges(org.apache.spark.sql.Dataset<?> batch) {
    SparkPlan plan =
        ((org.apache.spark.sql.classic.Dataset<?>) batch).queryExecution().executedPlan();
    List<String> ranges = new ArrayList<>();
    boolean found = false;
    for (SparkPlan leaf : CollectionConverters.asJava(plan.collectLeaves())) {
      if (leaf instanceof MicroBatchScanExec scan) {
        found = true;
        for (InputPartition partition : CollectionConverters.asJava(scan.inputPartitions())) {
          addRange(ranges, partition);
        }
      } else if (leaf instanceof RDDScanExec scan) {
        ArrayDeque<RDD<?>> lineage = new ArrayDeque<>(List.of(scan.rdd()));
        while (!lineage.isEmpty()) {
          RDD<?> rdd = lineage.pop();
          if (rdd instanceof DataSourceRDD) {
            found = true;
            for (Partition partition : rdd.partitions()) {
              scala.Option<InputPartition> input =
                  ((DataSourceRDDPartition) partition).inputPartition();
              if (input.isDefined()) {
                addRange(ranges, input.get());
              }
            }
          } else {
            for (Dependency<?> dependency : CollectionConverters.asJava(rdd.dependencies())) {
              lineage.push(dependency.rdd());
            }
          }
        }
      }
    }
    if (!found) {
      throw new IllegalStateException("no Kafka micro-batch scan in the plan:\n" + plan);
    }
    return ranges;
  }

  private static void addRange(List<String> ranges, InputPartition partition) {
    if (!(partition instanceof KafkaBatchInputPartition kafka)) {
      throw new IllegalStateException("not a Kafka micro-batch: " + partition.getClass());
    }
    KafkaOffsetRange range = kafka.offsetRange();
    if (range.untilOffset() > range.fromOffset()) {
      ranges.add(
          range.topicPartition().topic()
              + "\t"
              + range.topicPartition().partition()
              + "\t"
              + range.fromOffset()
              + "\t"
              + range.untilOffset());
    }
  }

  /**
   * Copies {@code ranges} (from {@link #plannedRanges}) on the executors, one task per range.
   * Returns {records copied, bytes of their keys, values and headers}.
   */
  public static long[] copy(JavaSparkContext spark, List<String> ranges, Map<String, String> settings) {
    long[] total = new long[2];
    if (ranges.isEmpty()) {
      return total;
    }
    HashMap<String, String> shipped = new HashMap<>(settings);
    for (long[] copied : spark.parallelize(ranges, ranges.size()).map(new CopyRange(shipped)).collect()) {
      total[0] += copied[0];
      total[1] += copied[1];
    }
    return total;
  }

  /** One task: copy one offset range of one source partition. */
  static final class CopyRange implements Function<String, long[]> {
    private static final long serialVersionUID = 1L;
    private final HashMap<String, String> settings;

    CopyRange(HashMap<String, String> settings) {
      this.settings = settings;
    }

    @Override
    public long[] call(String range) throws Exception {
      String[] fields = range.split("\t");
      TopicPartition tp = new TopicPartition(fields[0], Integer.parseInt(fields[1]));
      long from = Long.parseLong(fields[2]);
      long until = Long.parseLong(fields[3]);
      String remote = settings.get("topic." + tp.topic());
      if (remote == null) {
        return new long[2]; // matched the subscription's pattern but not the flow's filters
      }
      Map<String, Object> consumerConfig = consumerConfig();
      PartitionReader reader = KafkaClients.borrow(consumerConfig, tp);
      boolean healthy = false;
      try {
        long[] copied = copy(reader, tp, from, until, remote);
        healthy = true;
        return copied;
      } finally {
        if (healthy) {
          KafkaClients.release(consumerConfig, tp, reader);
        } else {
          reader.close();
        }
      }
    }

    private long[] copy(PartitionReader reader, TopicPartition tp, long from, long until, String remote)
        throws Exception {
      long limit = Long.parseLong(settings.get("limit." + remote));
      long overhead = Long.parseLong(settings.getOrDefault("record.overhead", "0"));
      long pollTimeoutMs = Long.parseLong(settings.getOrDefault("poll.timeout.ms", "120000"));
      Map<String, Object> producerConfig = clientConfig("producer.");
      KafkaProducer<byte[], byte[]> producer = KafkaClients.producer(producerConfig);
      OffsetSyncWriter syncs = syncWriter();
      AtomicReference<Exception> failure = new AtomicReference<>();
      reader.seek(from);
      long next = from;
      long records = 0;
      long bytes = 0;
      long lastProgress = System.currentTimeMillis();
      while (next < until && failure.get() == null) {
        List<ConsumerRecord<byte[], byte[]>> polled;
        try {
          polled = reader.poll(Duration.ofMillis(500));
        } catch (AuthenticationException | AuthorizationException refused) {
          throw refusedBy("source", "reading " + tp, refused);
        } catch (OffsetOutOfRangeException gone) {
          long earliest = reader.earliest();
          LOG.warn(
              "{}: offsets {} to {} are no longer on {} (retention or truncation); copying from {}",
              tp, next, earliest - 1, settings.get("source"), Math.min(earliest, until));
          if (earliest >= until) {
            break;
          }
          next = earliest;
          reader.seekAfterLoss(next);
          continue;
        }
        if (polled.isEmpty()) {
          if (reader.position() >= until) {
            next = until; // the rest of the range holds no records for us (markers, aborts)
            break;
          }
          if (System.currentTimeMillis() - lastProgress > pollTimeoutMs) {
            throw new org.apache.kafka.common.errors.TimeoutException(
                settings.get("error.prefix") + "cluster " + settings.get("source") + " did not answer: no records of "
                    + tp + " from offset " + next + " within " + pollTimeoutMs + " ms");
          }
          continue;
        }
        lastProgress = System.currentTimeMillis();
        for (int i = 0; i < polled.size(); i++) {
          ConsumerRecord<byte[], byte[]> record = polled.get(i);
          if (record.offset() >= until) {
            reader.endRange(until, polled.subList(i, polled.size()));
            next = until;
            break;
          }
          long size = size(record);
          if (size + overhead > limit) {
            producer.flush();
            throw new IllegalStateException(
                settings.get("error.prefix") + "record " + tp + "@" + record.offset() + " (" + size
                    + " bytes) is larger than max.message.bytes=" + limit + " of " + remote
                    + " on " + settings.get("target")
                    + "; raise max.message.bytes on the target topic (nothing after it was copied)");
          }
          long upstream = record.offset();
          long timestamp = record.timestamp();
          try {
            producer.send(
                new ProducerRecord<>(
                    remote, tp.partition(), timestamp >= 0 ? timestamp : null,
                    record.key(), record.value(), record.headers()),
                (metadata, error) -> {
                  if (error != null) {
                    failure.compareAndSet(null, error);
                    if (syncs != null) {
                      syncs.failed(tp);
                    }
                  } else if (syncs != null && metadata.hasOffset()) {
                    syncs.acknowledged(tp, upstream, metadata.offset());
                  }
                });
          } catch (KafkaException refusedOrFailed) { // a producer in a failed state throws here
            failure.compareAndSet(null, refusedOrFailed);
            break;
          }
          records++;
          bytes += size;
          next = upstream + 1;
        }
      }
      if (next >= until) {
        reader.endRangeIfOpen(until);
      }
      producer.flush();
      Exception error = failure.get();
      if (error != null) {
        KafkaClients.discardProducer(producerConfig);
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
          if (cause instanceof AuthenticationException || cause instanceof AuthorizationException) {
            throw refusedBy("target", "writing " + remote + "-" + tp.partition(), (Exception) cause);
          }
        }
        throw new IllegalStateException(
            settings.get("error.prefix") + "copying " + tp + " to " + remote + " on " + settings.get("target")
                + " failed: " + error,
            error);
      }
      return new long[] {records, bytes};
    }

    /** One line naming the cluster and the principal it refused, and what to check. */
    private IllegalStateException refusedBy(String side, String action, Exception error) {
      String cluster = settings.get(side);
      String principal = settings.getOrDefault(side + ".principal", "(no SASL user)");
      return new IllegalStateException(
          settings.get("error.prefix") + "cluster " + cluster + " refused principal " + principal + " while "
              + action + ": " + error.getMessage() + "; check the credentials and ACLs of "
              + principal + " on " + cluster,
          error);
    }

    private static long size(ConsumerRecord<byte[], byte[]> record) {
      long size = (record.key() == null ? 0 : record.key().length)
          + (record.value() == null ? 0 : record.value().length);
      for (Header header : record.headers()) {
        size += header.key().getBytes(StandardCharsets.UTF_8).length;
        size += header.value() == null ? 0 : header.value().length;
      }
      return size;
    }

    private Map<String, Object> consumerConfig() {
      Map<String, Object> config = clientConfig("consumer.");
      config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
      config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
      config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
      config.remove(ConsumerConfig.GROUP_ID_CONFIG);
      return config;
    }

    private OffsetSyncWriter syncWriter() {
      String topic = settings.get("syncs.topic");
      if (topic == null) {
        return null;
      }
      Map<String, Object> config = clientConfig("syncs.producer.");
      config.put(ProducerConfig.ACKS_CONFIG, "all");
      config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
      try {
        return OffsetSyncWriter.shared(
            topic,
            Long.parseLong(settings.get("syncs.lag.max")),
            Long.parseLong(settings.get("syncs.interval.ms")),
            config);
      } catch (AuthenticationException | AuthorizationException refused) {
        throw refusedBy("syncs", "writing offset syncs to " + topic, refused);
      }
    }

    private Map<String, Object> clientConfig(String prefix) {
      Map<String, Object> config = new HashMap<>();
      for (Map.Entry<String, String> entry : settings.entrySet()) {
        if (entry.getKey().startsWith(prefix)) {
          config.put(entry.getKey().substring(prefix.length()), entry.getValue());
        }
      }
      if (!prefix.equals("consumer.")) {
        config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
      }
      return config;
    }
  }
}
