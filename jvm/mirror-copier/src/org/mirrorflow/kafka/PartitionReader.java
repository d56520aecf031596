package org.mirrorflow.kafka;

import java.time.Duration;
import java.util.List;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

/**
 * A consumer of one source partition that keeps what it fetched past the end of a micro-batch's
 * range, so the next range of the partition (which starts there) needs neither a seek nor a
 * second fetch of the same records.
 */
final class PartitionReader {
  private final KafkaConsumer<byte[], byte[]> consumer;
  private final TopicPartition tp;
  private List<ConsumerRecord<byte[], byte[]>> kept = List.of();
  private long resumeAt = -1;

  PartitionReader(KafkaConsumer<byte[], byte[]> consumer, TopicPartition tp) {
    this.consumer = consumer;
    this.tp = tp;
    consumer.assign(List.of(tp));
  }

  /** Reads from {@code offset} on: a seek unless the last range of this reader ended there. */
  void seek(long offset) {
    if (offset != resumeAt) {
      kept = List.of();
      consumer.seek(tp, offset);
    }
    resumeAt = -1;
  }

  /** The next records: those kept from the last range first, else one poll. */
  List<ConsumerRecord<byte[], byte[]>> poll(Duration timeout) {
    if (!kept.isEmpty()) {
      List<ConsumerRecord<byte[], byte[]>> records = kept;
      kept = List.of();
      return records;
    }
    return consumer.poll(timeout).records(tp);
  }

  /** The range ended at {@code until}; {@code rest} are the records polled at or past it. */
  void endRange(long until, List<ConsumerRecord<byte[], byte[]>> rest) {
    kept = rest;
    resumeAt = until;
  }

  /** The range ended at {@code until} with nothing polled past it. */
  void endRangeIfOpen(long until) {
    if (resumeAt != until) {
      kept = List.of();
      resumeAt = until;
    }
  }

  /** The next offset the consumer fetches (past any kept records). */
  long position() {
    return consumer.position(tp);
  }

  long earliest() {
    return consumer.beginningOffsets(List.of(tp)).get(tp);
  }

  void seekAfterLoss(long offset) {
    kept = List.of();
    consumer.seek(tp, offset);
  }

  void close() {
    consumer.close(Duration.ofSeconds(5));
  }
}
