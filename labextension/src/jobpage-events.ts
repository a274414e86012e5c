/** The job page's Events tab: every event of the job (status changes, alerts), oldest first. */
import { h } from './dom';
import { dateTime } from './format';
import { JobTab, type JobPage } from './jobpage-tab';

export class EventsTab extends JobTab {
  readonly label = 'Events';

  constructor(page: JobPage) {
    super('events', page);
  }

  render(): void {
    const events = this.page.events;
    const section = this.section;
    if (section.childElementCount === events.length + 1) {
      return; // nothing new
    }
    section.replaceChildren(
      h(
        'table',
        { class: 'ma-facts ma-events-table' },
        h('tr', {}, ...['#', 'Time', 'Status', 'Node', 'By', 'Reason'].map(t => h('th', {}, t)))
      )
    );
    const table = section.firstElementChild as HTMLElement;
    for (const e of events) {
      const where = e.node ? (e.rank !== null && e.rank !== undefined ? `${e.node}/rank-${e.rank}` : e.node) : '';
      table.append(
        h(
          'tr',
          { class: e.alert ? 'ma-event-alert' : '' },
          ...[e.seq, dateTime(e.time), e.status, where, e.by ?? '', (e.alert ? 'ALERT: ' : '') + (e.reason ?? '')].map(v =>
            h('td', {}, String(v ?? ''))
          )
        )
      );
    }
  }
}
