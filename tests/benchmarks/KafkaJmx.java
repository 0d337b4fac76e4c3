import java.util.Set;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

/**
 * A running Kafka broker over JMX (an agent started with jcmd ManagementAgent.start):
 *   java KafkaJmx.java PORT counts              each request kind and how many the broker has completed
 *   java KafkaJmx.java PORT log LOGGER LEVEL    set a log4j logger's level (kafka.request.logger DEBUG: every request)
 */
public class KafkaJmx {
    public static void main(String[] args) throws Exception {
        JMXServiceURL url = new JMXServiceURL("service:jmx:rmi:///jndi/rmi://127.0.0.1:" + args[0] + "/jmxrmi");
        try (JMXConnector connector = JMXConnectorFactory.connect(url)) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            if (args[1].equals("log")) {
                ObjectName logs = new ObjectName("kafka:type=kafka.Log4jController");
                System.out.println(server.invoke(logs, "setLogLevel", new Object[] {args[2], args[3]},
                        new String[] {"java.lang.String", "java.lang.String"}));
                return;
            }
            Set<ObjectName> names = server.queryNames(
                    new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*"), null);
            TreeMap<String, Long> counts = new TreeMap<>();
            for (ObjectName name : names) {
                counts.merge(name.getKeyProperty("request"),
                        ((Number) server.getAttribute(name, "Count")).longValue(), Long::sum);
            }
            counts.forEach((kind, count) -> System.out.println(kind + " " + count));
        }
    }
}
