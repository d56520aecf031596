/*
 * Dumps the configuration definitions MirrorMaker 2 validates against (names, types, defaults) as
 * JSON, from the Kafka jars that jvm/mirrormaker/pom.xml pins. mirrorflow reads the result
 * (mirrorflow/mm2/data/mm2_config_defs.json, through mirrorflow/mm2/configdefs.py) to know MM2's
 * defaults and every key MM2 accepts.
 *
 * Regenerate after changing the Kafka version, from the checkout's root with the environment
 * activated (source "$(scripts/bootstrap.sh)/bin/activate"):
 *   java -cp "$(python -c 'from mirrorflow.runtime import jvm; print(jvm.classpath("mirrormaker"))')" \
 *       scripts/Mm2ConfigDefs.java > mirrorflow/mm2/data/mm2_config_defs.json
 */

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.utils.AppInfoParser;
import org.apache.kafka.connect.runtime.ConnectorConfig;

public class Mm2ConfigDefs {
    private static final String MIRROR = "org.apache.kafka.connect.mirror.";

    public static void main(String[] args) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("kafka_version", AppInfoParser.getVersion());
        Map<String, Object> connectors = new LinkedHashMap<>();
        connectors.put("source", describe(staticField(MIRROR + "MirrorSourceConfig", "CONNECTOR_CONFIG_DEF")));
        connectors.put("checkpoint", describe(staticField(MIRROR + "MirrorCheckpointConfig", "CONNECTOR_CONFIG_DEF")));
        connectors.put("heartbeat", describe(staticField(MIRROR + "MirrorHeartbeatConfig", "CONNECTOR_CONFIG_DEF")));
        out.put("connectors", connectors);
        out.put("connect_base", new TreeSet<>(ConnectorConfig.configDef().names()));
        Method mm = Class.forName(MIRROR + "MirrorMakerConfig").getDeclaredMethod("config");
        mm.setAccessible(true);
        out.put("mirrormaker", describe((ConfigDef) mm.invoke(null)));
        out.put("client_security", new TreeSet<>(staticField(MIRROR + "MirrorClientConfig", "CLIENT_CONFIG_DEF").names()));
        Class<?> distributed = Class.forName("org.apache.kafka.connect.runtime.distributed.DistributedConfig");
        Class<?> crypto = Class.forName("org.apache.kafka.connect.runtime.distributed.Crypto");
        Method worker = distributed.getDeclaredMethod("config", crypto);
        worker.setAccessible(true);
        ConfigDef workerDef = (ConfigDef) worker.invoke(null, crypto.getField("SYSTEM").get(null));
        out.put("worker", new TreeSet<>(workerDef.names()));
        out.put("consumer", new TreeSet<>(ConsumerConfig.configNames()));
        out.put("producer", new TreeSet<>(ProducerConfig.configNames()));
        out.put("admin", new TreeSet<>(AdminClientConfig.configNames()));
        new ObjectMapper().enable(SerializationFeature.INDENT_OUTPUT).writeValue(System.out, out);
    }

    private static ConfigDef staticField(String cls, String name) throws Exception {
        Field field = Class.forName(cls).getDeclaredField(name);
        field.setAccessible(true);
        return (ConfigDef) field.get(null);
    }

    private static Map<String, Object> describe(ConfigDef def) {
        Map<String, Object> keys = new TreeMap<>();
        for (ConfigDef.ConfigKey key : def.configKeys().values()) {
            Map<String, Object> entry = new LinkedHashMap<>();
            entry.put("type", key.type.name());
            if (key.hasDefault()) {
                entry.put("default", key.defaultValue == null ? null : ConfigDef.convertToString(key.defaultValue, key.type));
            }
            keys.put(key.name, entry);
        }
        return keys;
    }
}
